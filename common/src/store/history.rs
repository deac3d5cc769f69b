//! A session's past as points to go back to: a record of every ended turn (written with the turn's
//! end, in the same script), and forks — a new session whose history is the source's up to a
//! turn, or a step within it.
//!
//! Where a turn's messages sit: a turn appends its messages to the end of the history list, and
//! the list only ever loses messages from its head (a summary stands for them), so the messages of
//! the recorded turns after turn T are the last `Σ messages` of the list, whatever was trimmed
//! before. A step within a turn ends before the turn's next assistant message (its calls' results
//! are part of it).
//!
//! Each record carries the session's plan as its turn left it, so a fork starts from the plan
//! of its point.
//!
//! Invariants: records are kept for the last `SKEIN_SESSION_CHECKPOINTS` turns and expire with
//! the session; a fork never changes its source and never overwrites a session that exists; a
//! fork point whose messages were trimmed is refused, not approximated.

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::{decode, keys, SessionState, SessionStore, StoreError};
use crate::protocol::message::{Message, Role};
use crate::protocol::TurnStatus;

/// One ended turn of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// The session's turn number (1 for its first).
    pub turn: u64,
    pub task_id: String,
    pub agent: String,
    /// The model the turn asked first.
    pub model: String,
    pub status: TurnStatus,
    /// When it ended (milliseconds since the Unix epoch) and how long it ran.
    pub ended_at_ms: u64,
    pub duration_ms: u64,
    /// Model calls made.
    pub steps: u32,
    /// Tool and subagent calls the model asked for.
    pub calls: u32,
    pub tokens: u64,
    /// Messages the turn added to the history (its input first).
    pub messages: u32,
    /// The session's plan as the turn left it (none when the session had none), so a fork at
    /// this turn starts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::protocol::Plan>,
    /// When each of its steps that made calls ended (a fork at a step takes the workspace's
    /// files of then).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_ends: Vec<crate::agent::seams::StepEnd>,
}

/// Where a fork of a session starts: after turn `turn` (0: before the first, an empty session),
/// or after step `step` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkPoint {
    pub turn: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
}

impl ForkPoint {
    /// Reads `T` or `T.S`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a fork point: TURN or TURN.STEP, as in 3 or 3.2");
        let (turn, step) = match text.split_once('.') {
            Some((turn, step)) => (turn, Some(step.parse().map_err(|_| bad())?)),
            None => (text, None),
        };
        let turn: u64 = turn.parse().map_err(|_| bad())?;
        if turn == 0 && step.is_some() {
            return Err(bad());
        }
        Ok(Self { turn, step })
    }
}

impl std::fmt::Display for ForkPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.step {
            Some(step) => write!(f, "{}.{step}", self.turn),
            None => write!(f, "{}", self.turn),
        }
    }
}

/// Where a forked session came from (kept in its state).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkedFrom {
    pub session: String,
    pub at: ForkPoint,
}

/// Why a fork could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error("session {0} has no record of turn {1}; recorded turns: {2}")]
    UnknownTurn(String, u64, String),
    #[error("the messages of turn {0} are no longer stored (trimmed from the session's history)")]
    Trimmed(u64),
    #[error("session {0} exists already; name a new one")]
    TargetExists(String),
    #[error("{0}")]
    NoInstant(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A session's history split at a turn: what comes before it, and the turn's own messages.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnMessages {
    pub record: TurnRecord,
    /// The stored messages before the turn (those a summary stands for included while stored).
    pub before: Vec<Message>,
    /// The turn's messages, its input first.
    pub messages: Vec<Message>,
}

impl SessionStore {
    /// The session's turn records, oldest first.
    pub async fn turn_records(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let mut conn = self.connection.clone();
        let listed: Vec<String> = conn
            .lrange(keys::turn_records(tenant, session), 0, -1)
            .await?;
        listed.iter().map(|r| decode(r)).collect()
    }

    /// A recorded turn's messages and the stored history before them.
    pub async fn turn_messages(
        &self,
        tenant: &str,
        session: &str,
        turn: u64,
    ) -> Result<TurnMessages, ForkError> {
        let mut conn = self.connection.clone();
        let (records, listed): (Vec<String>, Vec<String>) = redis::pipe()
            .atomic()
            .lrange(keys::turn_records(tenant, session), 0, -1)
            .lrange(keys::history(tenant, session), 0, -1)
            .query_async(&mut conn)
            .await
            .map_err(StoreError::from)?;
        let records: Vec<TurnRecord> = records
            .iter()
            .map(|r| decode(r))
            .collect::<Result<_, _>>()?;
        let Some(record) = records.iter().find(|r| r.turn == turn).cloned() else {
            let known: Vec<String> = records.iter().map(|r| r.turn.to_string()).collect();
            return Err(ForkError::UnknownTurn(
                session.to_owned(),
                turn,
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            ));
        };
        let after: u64 = records
            .iter()
            .filter(|r| r.turn > turn)
            .map(|r| u64::from(r.messages))
            .sum();
        let end = (listed.len() as u64)
            .checked_sub(after)
            .ok_or(ForkError::Trimmed(turn))?;
        let start = end
            .checked_sub(u64::from(record.messages))
            .ok_or(ForkError::Trimmed(turn))?;
        let decoded = |range: &[String]| -> Result<Vec<Message>, StoreError> {
            range.iter().map(|m| decode(m)).collect()
        };
        Ok(TurnMessages {
            before: decoded(&listed[..start as usize])?,
            messages: decoded(&listed[start as usize..end as usize])?,
            record,
        })
    }

    /// Whose workspace files, and as of which instant (milliseconds since the Unix epoch; see
    /// [`files_instant`]), a fork of `source` at `at` gets: `source`'s, or — when `source` is a
    /// fork and the point lies in what it took from its own source — that session's, since a
    /// fork's files were written when it was made.
    pub async fn fork_instant(
        &self,
        tenant: &str,
        source: &str,
        at: ForkPoint,
    ) -> Result<(String, u64), ForkError> {
        let mut session = source.to_owned();
        for _ in 0..MAX_FORK_CHAIN {
            let loaded = self.load(tenant, &session).await?;
            match loaded.state.forked_from {
                Some(from) if inherited(at, from.at) => session = from.session,
                _ => break,
            }
        }
        let records = self.turn_records(tenant, &session).await?;
        files_instant(&records, at)
            .map(|instant| (session, instant))
            .map_err(ForkError::NoInstant)
    }

    /// Makes session `to` from `source` as it was at `at`: its history up to that point, its
    /// summary while the point lies past what the summary stands for, its skills, the records
    /// of the turns it holds, and `forked_from`. The source is not changed; `to` must not exist.
    pub async fn fork_session(
        &self,
        tenant: &str,
        source: &str,
        at: ForkPoint,
        to: &str,
    ) -> Result<SessionState, ForkError> {
        let target = self.load(tenant, to).await?;
        if target.version > 0 {
            return Err(ForkError::TargetExists(to.to_owned()));
        }
        let loaded = self.load(tenant, source).await?;
        let forked_from = Some(ForkedFrom {
            session: source.to_owned(),
            at,
        });
        if at.turn == 0 {
            let state = SessionState {
                forked_from,
                ..SessionState::default()
            };
            self.save(tenant, to, 0, &state).await?;
            return Ok(state);
        }
        let split = self.turn_messages(tenant, source, at.turn).await?;
        let mut kept = split.messages;
        if let Some(step) = at.step {
            kept.truncate(step_end(&kept, step));
        }
        let whole_turn = at.step.is_none() || kept.len() == split.record.messages as usize;
        let records = self.turn_records(tenant, source).await?;
        let after_messages: usize = records
            .iter()
            .filter(|r| r.turn > at.turn)
            .map(|r| r.messages as usize)
            .sum();
        // The loaded history is the list from its offset on; what lies before the offset is what
        // the session's summary stands for.
        let list_len = split.before.len() + split.record.messages as usize + after_messages;
        let offset = list_len.saturating_sub(loaded.state.history.len());
        let mut history = split.before;
        history.extend(kept);
        let (history, summary) = match &loaded.state.summary {
            // The fork keeps the summary only while it stands for messages before the point.
            Some(summary) if offset <= history.len() => {
                (history.split_off(offset), Some(summary.clone()))
            }
            _ => (history, None),
        };
        // The plan as the fork point found it: as the turn left it, or, within a turn, as the
        // turn before left it (a step's own revisions are not recorded apart).
        let plan_turn = if whole_turn { at.turn } else { at.turn - 1 };
        let plan = records
            .iter()
            .find(|r| r.turn == plan_turn)
            .and_then(|r| r.plan.clone());
        let state = SessionState {
            history,
            turns: if whole_turn { at.turn } else { at.turn - 1 },
            skills: loaded.state.skills.clone(),
            summary,
            plan,
            forked_from,
            stored: Default::default(),
        };
        self.save(tenant, to, 0, &state).await?;
        let kept_records: Vec<String> = records
            .iter()
            .filter(|r| r.turn < at.turn || (r.turn == at.turn && whole_turn))
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()
            .map_err(StoreError::Corrupt)?;
        if !kept_records.is_empty() {
            let mut conn = self.connection.clone();
            let () = conn
                .rpush(keys::turn_records(tenant, to), kept_records)
                .await
                .map_err(StoreError::from)?;
        }
        Ok(state)
    }
}

/// Forks of forks followed back at most this far to find whose files a point had.
const MAX_FORK_CHAIN: usize = 32;

/// Whether point `at` of a fork made at `forked_at` lies in what the fork took from its source:
/// its whole turns (a fork at a step holds the turns before that one whole).
fn inherited(at: ForkPoint, forked_at: ForkPoint) -> bool {
    let whole_turns = match forked_at.step {
        None => forked_at.turn,
        Some(_) => forked_at.turn.saturating_sub(1),
    };
    at.turn <= whole_turns
}

/// When the point `at` was, among a session's turn records: a turn's end; a step's end (every
/// call of it answered), or the turn's end for its answering step; for `0`, the start of the
/// first turn.
pub fn files_instant(records: &[TurnRecord], at: ForkPoint) -> Result<u64, String> {
    let record_of = |turn: u64| {
        records.iter().find(|r| r.turn == turn).ok_or_else(|| {
            format!("turn {turn} has no record any more, so when it ran is not known")
        })
    };
    if at.turn == 0 {
        let first = record_of(1)?;
        return Ok(first.ended_at_ms.saturating_sub(first.duration_ms));
    }
    let record = record_of(at.turn)?;
    match at.step {
        None => Ok(record.ended_at_ms),
        Some(step) => match record.step_ends.iter().find(|end| end.step == step) {
            Some(end) => Ok(end.at_ms),
            None if step >= record.steps => Ok(record.ended_at_ms),
            None => Err(format!(
                "when step {step} of turn {} ended is not recorded (the turn ran before step \
                 times were kept)",
                at.turn
            )),
        },
    }
}

/// How many of a turn's messages end with step `step` (its first `step` model responses and the
/// results of their calls): everything before the turn's `step + 1`-th assistant message.
pub fn step_end(messages: &[Message], step: u32) -> usize {
    let mut seen = 0;
    for (i, message) in messages.iter().enumerate() {
        if message.role == Role::Assistant {
            if seen == step {
                return i;
            }
            seen += 1;
        }
    }
    messages.len()
}

/// The calls a turn's messages asked for, in order.
pub fn calls_of(messages: &[Message]) -> impl Iterator<Item = &crate::protocol::message::ToolCall> {
    messages.iter().flat_map(|m| m.tool_calls.iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_points_read_turns_and_steps() {
        assert_eq!(
            ForkPoint::parse("3").expect("valid"),
            ForkPoint {
                turn: 3,
                step: None
            }
        );
        assert_eq!(
            ForkPoint::parse("3.2").expect("valid"),
            ForkPoint {
                turn: 3,
                step: Some(2)
            }
        );
        assert_eq!(ForkPoint::parse("0").expect("valid").turn, 0);
        for bad in ["", "0.1", "a", "3.", "3.x", "-1"] {
            assert!(ForkPoint::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(ForkPoint::parse("4.1").expect("valid").to_string(), "4.1");
    }

    #[test]
    fn a_fork_takes_the_files_of_its_turns_end_or_its_steps_end() {
        use crate::agent::seams::StepEnd;
        let record =
            |turn: u64, ended_at_ms: u64, steps: u32, step_ends: Vec<StepEnd>| TurnRecord {
                turn,
                task_id: format!("t{turn}"),
                agent: "a".into(),
                model: "m".into(),
                status: TurnStatus::Completed,
                ended_at_ms,
                duration_ms: 100,
                steps,
                calls: 0,
                tokens: 0,
                messages: 0,
                plan: None,
                step_ends,
            };
        let records = [
            record(1, 1_000, 1, vec![]),
            record(
                2,
                2_000,
                3,
                vec![
                    StepEnd {
                        step: 1,
                        at_ms: 1_500,
                    },
                    StepEnd {
                        step: 2,
                        at_ms: 1_700,
                    },
                ],
            ),
            record(
                3,
                3_000,
                3,
                vec![StepEnd {
                    step: 2,
                    at_ms: 2_800,
                }],
            ),
        ];
        let at = |text: &str| files_instant(&records, ForkPoint::parse(text).expect("point"));
        assert_eq!(at("0"), Ok(900), "before the first turn started");
        assert_eq!(at("1"), Ok(1_000));
        assert_eq!(at("2.1"), Ok(1_500));
        assert_eq!(at("2.2"), Ok(1_700));
        assert_eq!(
            at("2.3"),
            Ok(2_000),
            "the answering step ends with the turn"
        );
        let unrecorded = at("3.1").expect_err("step 1 of turn 3 has no time");
        assert!(unrecorded.contains("step 1 of turn 3"), "{unrecorded}");
        assert!(at("4").is_err());
    }

    #[test]
    fn a_forks_point_before_its_own_turns_lies_in_its_source() {
        let point = |text: &str| ForkPoint::parse(text).expect("point");
        assert!(inherited(point("2"), point("3")));
        assert!(inherited(point("3.1"), point("3")));
        assert!(inherited(point("0"), point("1.2")));
        assert!(
            !inherited(point("3"), point("3.2")),
            "turn 3 of the fork is its own"
        );
        assert!(!inherited(point("4"), point("3")));
    }

    #[test]
    fn a_step_ends_before_the_next_model_response() {
        let call = |id: &str| crate::protocol::message::ToolCall {
            id: id.into(),
            name: "t".into(),
            arguments: serde_json::json!({}),
        };
        let mut asked = Message::assistant("");
        asked.tool_calls = vec![call("c1")];
        let turn = vec![
            Message::user("go"),
            asked.clone(),
            Message::tool_result("c1", "r1"),
            asked,
            Message::tool_result("c1", "r2"),
            Message::assistant("done"),
        ];
        assert_eq!(step_end(&turn, 0), 1, "step 0: the input alone");
        assert_eq!(
            step_end(&turn, 1),
            3,
            "step 1: the first response and its result"
        );
        assert_eq!(step_end(&turn, 2), 5);
        assert_eq!(step_end(&turn, 9), 6, "past the end: the whole turn");
        assert_eq!(calls_of(&turn).count(), 2);
    }
}
