//! `SessionStore`: everything Skein keeps in Redis — sessions (history) with versioned
//! compare-and-set saves, the per-session lease, call results by call id, final results, and the
//! worker registry. Key layout lives in [`keys`]; a lead turn's life under the lease is one type,
//! [`TurnLease`] (`turn`); the lease taken, renewed and released on its own in `lease`; the
//! session scripts live in `scripts`; a turn's checkpoint written under the lease in
//! `checkpoints`; call results, attempts and child-turn checkpoints live in
//! `calls`, the worker registry in `workers`, the cluster's model traffic (slots, fair share,
//! tokens per minute) in [`traffic`], the spending ledgers of tasks and tenants in [`budget`],
//! what was asked of a running task (pause, steer, interrupt) in [`control`].
//!
//! Invariants:
//! - a save names the version it read; if another writer saved since, the save is refused
//!   ([`StoreError::Conflict`]) and nothing is overwritten (fencing);
//! - a call's result is recorded once: the first write wins, later duplicates are discarded;
//! - every Redis call is bounded by a response timeout; an unreachable Redis is an error, never a
//!   hang;
//! - a session's lease always lapses: one found with no expiry (which no lead writes: set by hand
//!   or by a broken tool) is given the lease's time to live where it is found held, with a
//!   warning, so it cannot keep the session's turns from running for ever.

pub mod approvals;
pub mod budget;
mod calls;
mod checkpoints;
mod connection;
pub mod control;
pub mod history;
pub mod keys;
mod lease;
mod lua;
mod nonces;
pub mod rate;
pub mod responses;
mod scripts;
mod sessions;
pub mod threads;
pub(crate) mod topology;
pub mod traffic;
mod turn;
mod workers;

pub use calls::{ChildProgress, ForgetError, ResultSlot, RunMarker};
pub use sessions::{Removal, SessionHold, SessionSummary};
pub use turn::{Ended, TurnClaim, TurnLease, TurnStart};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::agent::runtime::{Compaction, Summary};
pub use crate::agent::seams::TurnCheckpoint;
use crate::config::RedisConfig;
use crate::protocol::message::Message;
use crate::protocol::{Failure, FailureKind, FinalResult, ToolResult};
use connection::RedisConnection;
use scripts::{BEGIN_SCRIPT, COMPLETE_SCRIPT, LOAD_SCRIPT, SAVE_SCRIPT, STORE_FINAL_SCRIPT};

/// How long a final result stays retrievable.
const FINAL_RESULT_TTL_SECS: u64 = 7 * 24 * 3600;
/// How long the checkpoint of an unfinished turn is kept.
const CHECKPOINT_TTL_SECS: u64 = 24 * 3600;
/// How long a session's recorded call results live after the last one recorded.
const RESULTS_TTL_SECS: u64 = 7 * 24 * 3600;
/// How long attempt counters live after their last change.
const ATTEMPTS_TTL_SECS: u64 = 7 * 24 * 3600;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("redis unavailable: {0}")]
    Unavailable(#[source] redis::RedisError),
    #[error("session was saved by another writer (expected version {expected})")]
    Conflict { expected: u64 },
    #[error("the session lease was lost to another writer")]
    LeaseLost,
    #[error("stored value is corrupt: {0}")]
    Corrupt(#[source] serde_json::Error),
    #[error("unexpected reply from {0}")]
    UnexpectedReply(&'static str),
    #[error("stored {what} is not a number in range: {text:?}")]
    BadNumber { what: &'static str, text: String },
    #[error("Redis settings: {0}")]
    Config(String),
    #[error("a stored value has the wrong type: {0}")]
    WrongType(#[source] redis::RedisError),
}

impl StoreError {
    pub fn to_failure(&self) -> Failure {
        match self {
            StoreError::Unavailable(_) | StoreError::Conflict { .. } | StoreError::LeaseLost => {
                Failure::new(FailureKind::Unavailable, self.to_string())
            }
            StoreError::Corrupt(_)
            | StoreError::UnexpectedReply(_)
            | StoreError::BadNumber { .. }
            | StoreError::WrongType(_)
            | StoreError::Config(_) => Failure::new(FailureKind::Internal, self.to_string()),
        }
    }

    /// Whether trying again cannot help: what is stored is unreadable (corrupt, out of range, of
    /// the wrong type), so every attempt would fail the same way. Such a task is set aside with
    /// this reason at once, not retried.
    pub fn is_persistent(&self) -> bool {
        matches!(
            self,
            StoreError::Corrupt(_)
                | StoreError::BadNumber { .. }
                | StoreError::UnexpectedReply(_)
                | StoreError::WrongType(_)
        )
    }
}

/// A number the store keeps (a version, an attempt count), or why it is not one.
fn parse_number(what: &'static str, text: &str) -> Result<u64, StoreError> {
    text.parse::<u64>().map_err(|_| StoreError::BadNumber {
        what,
        text: text.chars().take(64).collect(),
    })
}

/// The version after `version`; a version at the top of the range is corrupt, not a wrap.
fn next_version(version: u64) -> Result<u64, StoreError> {
    version.checked_add(1).ok_or(StoreError::BadNumber {
        what: "session version",
        text: version.to_string(),
    })
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        // A WRONGTYPE reply may come alone, or inside a failed pipeline or transaction.
        let wrong_type = e.kind() == redis::ErrorKind::UnexpectedReturnType
            || e.clone()
                .into_server_errors()
                .is_some_and(|errors| errors.iter().any(|(_, error)| error.code() == "WRONGTYPE"));
        if wrong_type {
            StoreError::WrongType(e)
        } else {
            StoreError::Unavailable(e)
        }
    }
}

/// What a session keeps between turns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionState {
    pub history: Vec<Message>,
    /// Turns completed.
    pub turns: u64,
    /// Skills loaded so far; their bodies stay in the system prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// What the model made of the compacted history: it stands for the stored messages before
    /// `history` (which holds only those after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    /// The plan the session's agent keeps (`update_plan`, `run_plan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::protocol::Plan>,
    /// The session this one was forked from, and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<history::ForkedFrom>,
    /// Where `history` sits in the stored list (set when loaded): a save appends only what the
    /// store does not hold. Bookkeeping, not part of the session's value.
    #[serde(skip)]
    pub stored: StoredMessages,
}

impl SessionState {
    /// Records a turn's compaction: its summary stands for the first `compacted` messages of
    /// `history`, which leave it (they stay in the stored list, before the loaded part). A turn
    /// that compacted only its own steps changes nothing here: its messages are stored whole.
    pub fn compact(&mut self, compaction: &Compaction) {
        let Some(summary) = &compaction.summary else {
            return;
        };
        let compacted = compaction.compacted.min(self.history.len());
        self.history.drain(..compacted);
        self.summary = Some(summary.clone());
        if self.stored.loaded && compacted <= self.stored.count {
            self.stored.count -= compacted;
            self.stored.offset += compacted as u64;
        } else {
            // Not all of them are stored: the list is written anew from what is left.
            self.stored = StoredMessages::default();
        }
    }
}

/// Where a loaded session's history sits in its stored list: the list's first `offset` messages
/// are summarised (not loaded), the next `count` are `history`'s first. A session built by hand
/// (not `loaded`) is written whole by its next save. Equal to every other (it is bookkeeping).
#[derive(Debug, Clone, Copy, Default)]
pub struct StoredMessages {
    loaded: bool,
    count: usize,
    offset: u64,
}

impl PartialEq for StoredMessages {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

/// What a session save writes: the session without its history, the messages to add to the
/// history list (after emptying it, when `replace`), where the loaded part starts in the list
/// afterwards (`offset`), and how many of the oldest (summarised) messages to drop first (`trim`)
/// to keep the list within the session cap.
struct HistoryWrite {
    meta: String,
    replace: bool,
    messages: Vec<String>,
    offset: u64,
    trim: u64,
}

impl HistoryWrite {
    fn of(state: &SessionState, max_messages: u64) -> Result<Self, StoreError> {
        let meta = crate::json_out::to_string(&SessionMeta {
            history: [],
            turns: state.turns,
            skills: &state.skills,
            summary: state.summary.as_ref(),
            plan: state.plan.as_ref(),
            forked_from: state.forked_from.as_ref(),
        })
        .map_err(StoreError::Corrupt)?;
        let stored = state.stored;
        let replace = !stored.loaded || stored.count > state.history.len();
        let (from, offset) = if replace {
            (0, 0)
        } else {
            (stored.count, stored.offset)
        };
        let messages = state.history[from..]
            .iter()
            .map(|m| crate::json_out::to_string(m).map_err(StoreError::Corrupt))
            .collect::<Result<_, _>>()?;
        // Only summarised messages are dropped: the context may still need the others.
        let length = offset + state.history.len() as u64;
        let trim = if max_messages > 0 && length > max_messages {
            offset.min(length - max_messages)
        } else {
            0
        };
        Ok(Self {
            meta,
            replace,
            messages,
            offset: offset - trim,
            trim,
        })
    }
}

/// A session's state as stored beside its history list.
#[derive(Serialize)]
struct SessionMeta<'a> {
    history: [Message; 0],
    turns: u64,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    skills: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<&'a Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a crate::protocol::Plan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    forked_from: Option<&'a history::ForkedFrom>,
}

/// A session read back: its state (without history when it has a history list), where the
/// loaded part of the list starts, and that part.
fn session_from(state: &str, offset: u64, listed: Vec<String>) -> Result<SessionState, StoreError> {
    let mut session: SessionState = match state {
        "" => SessionState::default(),
        json => decode(json)?,
    };
    if listed.is_empty() && offset == 0 {
        // A session saved before history lists (or empty): its history is inline; the next save
        // moves it into the list.
        session.stored = StoredMessages::default();
        return Ok(session);
    }
    session.history = listed.iter().map(|m| decode(m)).collect::<Result<_, _>>()?;
    session.stored = StoredMessages {
        loaded: true,
        count: session.history.len(),
        offset,
    };
    Ok(session)
}

/// What a worker may do with a call it was handed.
#[derive(Debug, Clone, PartialEq)]
pub enum CallAdmission {
    /// An earlier delivery finished it: this is its result.
    Recorded(ToolResult),
    /// Run it: `count` attempts are counted now, this one included; `first_count` when nothing
    /// was counted for the call before (not even a hand-back of an uncounted first delivery).
    Attempt { count: u64, first_count: bool },
    /// Another run of the call is in progress (its marker is held by `owner` and renewed): wait
    /// for its result rather than run beside it. Nothing was counted.
    RunningElsewhere { owner: String },
}

/// A session as loaded, with the version a save must name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedSession {
    pub version: u64,
    pub state: SessionState,
}

/// The turn-start script's reply as its strings and, when it carries one (last), the history list.
fn split_history(reply: Vec<redis::Value>) -> Result<(Vec<String>, Vec<String>), StoreError> {
    let mut strings = Vec::with_capacity(reply.len());
    let mut listed = Vec::new();
    for value in reply {
        match value {
            redis::Value::Array(items) => {
                listed = items
                    .into_iter()
                    .map(redis::from_redis_value)
                    .collect::<Result<_, _>>()
                    .map_err(|_| StoreError::UnexpectedReply("the turn-start script"))?
            }
            other => strings.push(
                redis::from_redis_value(other)
                    .map_err(|_| StoreError::UnexpectedReply("the turn-start script"))?,
            ),
        }
    }
    Ok((strings, listed))
}

fn decode<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, StoreError> {
    serde_json::from_str(json).map_err(StoreError::Corrupt)
}

/// Redis-backed state shared by every lead and worker.
#[derive(Clone)]
pub struct SessionStore {
    /// One node, the primary Sentinels name, or a Redis Cluster (`connection`).
    connection: RedisConnection,
    /// Seconds an idle session is kept after its last save; 0: for ever.
    session_ttl_secs: u64,
    session_max_messages: u64,
    /// Most turn records a session keeps (`history`).
    session_checkpoints: u64,
}

impl SessionStore {
    /// Connects; fails clearly if Redis cannot be reached within a few seconds.
    pub async fn connect(cfg: &RedisConfig) -> Result<Self, StoreError> {
        let connection = RedisConnection::open(cfg).await?;
        Ok(Self {
            connection,
            session_ttl_secs: cfg.session_ttl.map_or(0, |ttl| ttl.as_secs().max(1)),
            session_max_messages: cfg.session_max_messages,
            session_checkpoints: cfg.session_checkpoints,
        })
    }

    /// Loads a session; a session never saved is empty at version 0.
    pub async fn load(&self, tenant: &str, session: &str) -> Result<LoadedSession, StoreError> {
        let mut conn = self.connection.clone();
        let (reply, listed) = split_history(
            LOAD_SCRIPT
                .key(keys::session(tenant, session))
                .key(keys::history(tenant, session))
                .invoke_async(&mut conn)
                .await?,
        )?;
        let [version, state, offset] = reply.as_slice() else {
            return Err(StoreError::UnexpectedReply("the session-load script"));
        };
        Ok(LoadedSession {
            version: parse_number("session version", version)?,
            state: session_from(state, parse_number("history offset", offset)?, listed)?,
        })
    }

    /// Saves a session if it is still at `expected_version`; returns the new version.
    pub async fn save(
        &self,
        tenant: &str,
        session: &str,
        expected_version: u64,
        state: &SessionState,
    ) -> Result<u64, StoreError> {
        self.save_with(tenant, session, expected_version, state, None)
            .await
    }

    /// Saves a session as [`save`](Self::save) does, and with it `(key, value)` of the same
    /// session (one write): a subagent call's outcome beside its child turn's messages.
    pub(crate) async fn save_with(
        &self,
        tenant: &str,
        session: &str,
        expected_version: u64,
        state: &SessionState,
        also: Option<(String, String)>,
    ) -> Result<u64, StoreError> {
        let mut conn = self.connection.clone();
        let write = HistoryWrite::of(state, self.session_max_messages)?;
        let next = next_version(expected_version)?;
        let mut invocation = SAVE_SCRIPT.call();
        invocation
            .key(keys::session(tenant, session))
            .key(keys::history(tenant, session));
        let (also_value, also_ttl) = match also {
            Some((key, value)) => {
                invocation.key(key);
                (value, CHECKPOINT_TTL_SECS)
            }
            None => (String::new(), 0),
        };
        let saved: i64 = invocation
            .arg(expected_version)
            .arg(next)
            .arg(write.meta)
            .arg(if write.replace { "replace" } else { "append" })
            .arg(self.session_ttl_secs)
            .arg(write.offset)
            .arg(write.trim)
            .arg(also_value)
            .arg(also_ttl)
            .arg(write.messages)
            .invoke_async(&mut conn)
            .await?;
        if saved == 1 {
            Ok(next)
        } else {
            Err(StoreError::Conflict {
                expected: expected_version,
            })
        }
    }

    /// Starts a turn in one trip: answers with the task's final result if it already ended;
    /// otherwise, unless another lead holds the session's lease, counts the attempt and (within
    /// `max_attempts`) takes the lease and loads the session and the turn's checkpoint.
    pub async fn begin_turn(&self, claim: TurnClaim<'_>) -> Result<TurnStart, StoreError> {
        Ok(self.start_turn(claim, false).await?.0)
    }

    /// [`Self::begin_turn`], taking the next event epoch of the task in the same trip when
    /// `take_epoch` (see [`Self::next_event_epoch`]): the epoch is taken whatever the start's
    /// outcome, and returned with it.
    pub(super) async fn start_turn(
        &self,
        claim: TurnClaim<'_>,
        take_epoch: bool,
    ) -> Result<(TurnStart, Option<u64>), StoreError> {
        let TurnClaim {
            tenant,
            session,
            task_id,
            ..
        } = claim;
        let mut conn = self.connection.clone();
        let (reply, listed): (Vec<String>, Vec<String>) = split_history(
            BEGIN_SCRIPT
                .key(keys::final_result(tenant, session, task_id))
                .key(keys::lease(tenant, session))
                .key(keys::attempts(
                    tenant,
                    session,
                    &keys::turn_attempts_field(task_id),
                ))
                .key(keys::session(tenant, session))
                .key(keys::checkpoint(tenant, session, task_id))
                .key(keys::history(tenant, session))
                .key(keys::control(tenant, session, task_id))
                .key(keys::task_trace(tenant, session, task_id))
                .key(keys::legacy_checkpoint(tenant, session, task_id))
                .key(keys::event_epoch(tenant, session, task_id))
                .arg(claim.lease_token)
                .arg(claim.lease_ttl.as_millis().max(1) as u64)
                .arg(keys::turn_attempts_field(task_id))
                .arg(ATTEMPTS_TTL_SECS)
                .arg(claim.max_attempts)
                .arg(claim.trace.unwrap_or_default())
                .arg(CHECKPOINT_TTL_SECS)
                .arg(if take_epoch { "1" } else { "" })
                .invoke_async(&mut conn)
                .await?,
        )?;
        let number =
            |what, text: Option<&String>| parse_number(what, text.map_or("", String::as_str));
        let Some((epoch, reply)) = reply.split_first() else {
            return Err(StoreError::UnexpectedReply("the turn-start script"));
        };
        let epoch = match epoch.as_str() {
            "" => None,
            taken => Some(parse_number("event epoch", taken)?),
        };
        let start = match reply.first().map(String::as_str) {
            Some("finished") => Ok(TurnStart::Finished(decode(
                reply.get(1).map_or("", String::as_str),
            )?)),
            Some("busy") => {
                if reply.get(1).is_some_and(|note| note == lease::UNBOUNDED) {
                    lease::warn_unbounded(tenant, session, claim.lease_ttl);
                }
                Ok(TurnStart::Busy)
            }
            Some("exhausted") => Ok(TurnStart::Exhausted(number("attempt count", reply.get(1))?)),
            Some("started") if reply.len() == 10 => {
                let offset = number("history offset", reply.get(5))?;
                let state = session_from(&reply[3], offset, listed)?;
                let checkpoint = match reply[4].as_str() {
                    "" => None,
                    json => Some(decode(json)?),
                };
                Ok(TurnStart::Started {
                    attempt: number("attempt count", reply.get(1))?,
                    session: LoadedSession {
                        version: number("session version", reply.get(2))?,
                        state,
                    },
                    checkpoint,
                    controls: control::Controls::from_fields(
                        &reply[6], &reply[7], &reply[8], &reply[9],
                    )?,
                })
            }
            _ => Err(StoreError::UnexpectedReply("the turn-start script")),
        }?;
        Ok((start, epoch))
    }

    /// The `traceparent` kept for a task submitted without trace context (by its first
    /// delivery's turn start, see [`TurnClaim::trace`]), which its later deliveries continue.
    pub async fn task_trace(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
    ) -> Result<Option<String>, StoreError> {
        let mut conn = self.connection.clone();
        Ok(conn.get(keys::task_trace(tenant, session, task_id)).await?)
    }

    /// The next delivery number of a piece of work (from 1), which leads the sequence numbers of
    /// the events this delivery emits (see `BusEvents::with_epoch`).
    pub async fn next_event_epoch(
        &self,
        tenant: &str,
        session: &str,
        work: &str,
    ) -> Result<u64, StoreError> {
        let mut conn = self.connection.clone();
        let key = keys::event_epoch(tenant, session, work);
        let (epoch, _): (i64, bool) = redis::pipe()
            .atomic()
            .incr(&key, 1)
            .expire(&key, ATTEMPTS_TTL_SECS as i64)
            .query_async(&mut conn)
            .await?;
        u64::try_from(epoch).map_err(|_| StoreError::BadNumber {
            what: "event epoch",
            text: epoch.to_string(),
        })
    }

    /// Ends a turn in one step while `lease_token` holds the lease: saves the session state (when
    /// given, compare-and-set on `expected_version`), stores the final result, drops the
    /// checkpoint and releases the lease. A crash can therefore never save a turn's history
    /// without its final result (which would append it twice on resume). A final result is
    /// written once: if the task already ended on another path, nothing is saved and the final
    /// that stands is returned as [`Ended::Earlier`].
    ///
    /// The state and the record are taken, and dropped once written into the command: a turn's
    /// end waits on Redis longest when Redis is busiest, and its history is not kept twice
    /// meanwhile.
    pub async fn complete_turn(
        &self,
        lease_token: &str,
        expected_version: u64,
        state: Option<SessionState>,
        result: &FinalResult,
        record: Option<history::TurnRecord>,
    ) -> Result<Ended, StoreError> {
        let mut conn = self.connection.clone();
        let (tenant, session) = (result.tenant.as_str(), result.session.as_str());
        let write = state
            .map(|state| HistoryWrite::of(&state, self.session_max_messages))
            .transpose()?;
        let final_json = crate::json_out::to_string(result).map_err(StoreError::Corrupt)?;
        let mut invocation = COMPLETE_SCRIPT.call();
        invocation
            .key(keys::session(tenant, session))
            .key(keys::lease(tenant, session))
            .key(keys::final_result(tenant, session, &result.task_id))
            .key(keys::checkpoint(tenant, session, &result.task_id))
            .key(keys::history(tenant, session))
            .key(keys::turn_records(tenant, session))
            .arg(lease_token)
            .arg(expected_version)
            .arg(next_version(expected_version)?)
            .arg(write.as_ref().map_or("", |w| w.meta.as_str()))
            .arg(final_json)
            .arg(FINAL_RESULT_TTL_SECS)
            .arg(match &write {
                Some(w) if w.replace => "replace",
                _ => "append",
            })
            .arg(self.session_ttl_secs)
            .arg(write.as_ref().map_or(0, |w| w.offset))
            .arg(write.as_ref().map_or(0, |w| w.trim))
            .arg(match record.filter(|_| self.session_checkpoints > 0) {
                Some(record) => crate::json_out::to_string(&record).map_err(StoreError::Corrupt)?,
                None => String::new(),
            })
            .arg(self.session_checkpoints);
        // Moved into the command, so that the messages are not held twice while Redis answers.
        if let Some(write) = write {
            invocation.arg(write.messages);
        }
        let reply: Vec<redis::Value> = invocation.invoke_async(&mut conn).await?;
        let code: Option<i64> = reply
            .first()
            .and_then(|v| redis::from_redis_value(v.clone()).ok());
        match code {
            Some(1) => Ok(Ended::Stored),
            Some(0) => Err(StoreError::Conflict {
                expected: expected_version,
            }),
            Some(-1) => Err(StoreError::LeaseLost),
            Some(2) => {
                let earlier: String = reply
                    .get(1)
                    .and_then(|v| redis::from_redis_value(v.clone()).ok())
                    .ok_or(StoreError::UnexpectedReply("the turn-end script"))?;
                Ok(Ended::Earlier(Box::new(decode(&earlier)?)))
            }
            _ => Err(StoreError::UnexpectedReply("the turn-end script")),
        }
    }

    /// Takes back an attempt that did not really happen (work handed back on shutdown).
    pub async fn uncount_attempt(
        &self,
        tenant: &str,
        session: &str,
        work: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = conn
            .hincr(keys::attempts(tenant, session, work), work, -1)
            .await?;
        Ok(())
    }

    /// Forgets a task's final result, its turn's attempts, its controls (pause, steer,
    /// interrupt) and its kept trace, so the task can run again (replay of a dead letter).
    pub async fn forget_turn(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let () = redis::pipe()
            .atomic()
            .del(keys::final_result(tenant, session, task_id))
            .ignore()
            .del(keys::control(tenant, session, task_id))
            .del(keys::steer(tenant, session, task_id))
            .ignore()
            .del(keys::task_trace(tenant, session, task_id))
            .ignore()
            .hdel(
                keys::attempts(tenant, session, &keys::turn_attempts_field(task_id)),
                keys::turn_attempts_field(task_id),
            )
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Stores a task's final result for later lookup, once: a final stored earlier stands (a
    /// resubmit, or another path that ended the task first) and is returned as
    /// [`Ended::Earlier`].
    pub async fn store_final(&self, result: &FinalResult) -> Result<Ended, StoreError> {
        let mut conn = self.connection.clone();
        let json = crate::json_out::to_string(result).map_err(StoreError::Corrupt)?;
        let earlier: Option<String> = STORE_FINAL_SCRIPT
            .key(keys::final_result(
                &result.tenant,
                &result.session,
                &result.task_id,
            ))
            .arg(json)
            .arg(FINAL_RESULT_TTL_SECS)
            .invoke_async(&mut conn)
            .await?;
        match earlier {
            None => Ok(Ended::Stored),
            Some(json) => Ok(Ended::Earlier(Box::new(decode(&json)?))),
        }
    }

    /// A task's final result, if the task has finished.
    pub async fn final_result(
        &self,
        tenant: &str,
        session: &str,
        task_id: &str,
    ) -> Result<Option<FinalResult>, StoreError> {
        self.get_json(keys::final_result(tenant, session, task_id))
            .await
    }

    /// A JSON value stored as a plain string, if the key exists.
    pub(super) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: String,
    ) -> Result<Option<T>, StoreError> {
        let mut conn = self.connection.clone();
        let json: Option<String> = conn.get(key).await?;
        json.map(|j| serde_json::from_str(&j).map_err(StoreError::Corrupt))
            .transpose()
    }

    /// Stores `value` as JSON under `key` unless the key exists, expiring as sessions do; true
    /// when it was stored.
    pub(super) async fn set_new_json<T: Serialize>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<bool, StoreError> {
        let json = crate::json_out::to_string(value).map_err(StoreError::Corrupt)?;
        let mut set = redis::cmd("SET");
        set.arg(key).arg(&json).arg("NX");
        if self.session_ttl_secs > 0 {
            set.arg("EX").arg(self.session_ttl_secs);
        }
        let mut conn = self.connection.clone();
        let stored: Option<String> = set.query_async(&mut conn).await?;
        Ok(stored.is_some())
    }

    /// Stores a JSON value as a plain string that expires after `ttl_secs`.
    async fn set_json<T: Serialize>(
        &self,
        key: String,
        value: &T,
        ttl_secs: u64,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let json = crate::json_out::to_string(value).map_err(StoreError::Corrupt)?;
        let () = conn.set_ex(key, json, ttl_secs).await?;
        Ok(())
    }
}
