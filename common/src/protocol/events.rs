//! What a task tells its clients: the events of its turn (published on the task's event subject)
//! and its final result (announced as the last event, and stored for look-ups).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::Usage;
use super::{Failure, PayloadRef, Plan, Spent, Verdict};

/// One event of a turn, published on the task's event subject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnEvent {
    pub v: u32,
    pub task_id: String,
    /// Which agent loop emitted it: `lead`, or `subagent:<call_id>` for a child.
    pub source: String,
    /// Position in the source's sequence: it grows across deliveries of the task (a delivery's
    /// events are numbered from its epoch times 2^32, plus 1), so `(source, seq)` names one event
    /// and orders the source's events.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub event: EventKind,
}

/// A [`TurnEvent`] as it is sent: the same JSON, written from what the sending sink keeps (its
/// task id and source), not from copies made for every event.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TurnEventRef<'a> {
    pub v: u32,
    pub task_id: &'a str,
    pub source: &'a str,
    pub seq: u64,
    pub at_ms: u64,
    pub event: &'a EventKind,
}

impl TurnEvent {
    /// This event, borrowed as it is sent.
    pub fn borrowed(&self) -> TurnEventRef<'_> {
        TurnEventRef {
            v: self.v,
            task_id: &self.task_id,
            source: &self.source,
            seq: self.seq,
            at_ms: self.at_ms,
            event: &self.event,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    TurnStarted {
        agent: String,
        session: String,
        instance: String,
        /// Set when the turn continues an earlier, interrupted run: the steps already done.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resumed_at_step: Option<u32>,
        /// The trace the turn is recorded in (32 hex digits), when tracing is on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        trace_id: Option<String>,
    },
    ModelDelta {
        text: String,
    },
    /// A piece of the model's streamed reasoning (thinking models: DeepSeek's
    /// `reasoning_content`, the `reasoning` of OpenRouter and vLLM), sent before the answer's
    /// `model_delta`s of the same model call. Not part of the answer.
    ReasoningDelta {
        text: String,
    },
    /// A model call failed after it had begun to stream, and is made again (or its answer did not
    /// match the turn's output schema, and the model is asked to repair it): the `model_delta`
    /// and `reasoning_delta` events of the same source since its last event of another type are
    /// not part of the answer, and a client drops them. `failure` says why the attempt failed.
    OutputDiscarded {
        failure: Failure,
    },
    /// The session's older history, or the turn's own older steps, were summarised so the
    /// turn's requests fit the model's context: `messages` left the context (they stay stored),
    /// replaced by a summary.
    Compacted {
        messages: u64,
        /// Why: `tokens` (the request would fill too much of the context), `messages` (too many
        /// messages), `overflow` (the model refused a request as too long).
        trigger: String,
        tokens_before: u64,
        tokens_after: u64,
    },
    ToolStarted {
        call_id: String,
        tool: String,
        /// The call's arguments; when they are too large for an event, a string previewing their
        /// JSON (head and tail), and `arguments_ref` says where they are whole.
        arguments: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments_ref: Option<PayloadRef>,
        /// How the permission policy settled the call (`allowed` for a plain allow), so every
        /// decision is in the event stream; absent from producers that predate permissions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permission: Option<Verdict>,
        /// The rule (or mode) behind `permission`.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        rule: String,
    },
    ToolFinished {
        call_id: String,
        tool: String,
        ok: bool,
        worker_id: String,
        /// The start of the observation, for display.
        preview: String,
        /// How long the worker took to run it (absent when no worker ran it).
        #[serde(default, skip_serializing_if = "is_zero")]
        duration_ms: u64,
        /// How often the broker delivered it to a worker (absent when once, or when no worker
        /// ran it): more than one means a worker died or timed out with it and another ran it.
        #[serde(default, skip_serializing_if = "at_most_once")]
        attempts: u32,
    },
    /// A call waits for a person's approval; the turn is suspended (its state is saved and no
    /// lead holds it) until an `ApprovalDecision` answers it.
    ApprovalRequested {
        call_id: String,
        tool: String,
        /// As in `tool_started`: a preview when too large, with `arguments_ref`.
        arguments: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments_ref: Option<PayloadRef>,
        /// The rule (or mode) that asked.
        rule: String,
        /// When an unanswered request is denied (milliseconds since the Unix epoch).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at_ms: Option<u64>,
    },
    /// How a call's permission was settled when it was not a plain allow: denied by a rule or the
    /// mode, approved or refused by a person, expired; also every decision in `bypass` mode.
    ApprovalResolved {
        call_id: String,
        tool: String,
        verdict: Verdict,
        /// The rule (or mode) behind the verdict.
        rule: String,
        /// Who decided, when a person did.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        by: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
    },
    /// The turn stopped at a step boundary on a pause request; it holds no lead until resumed.
    Paused {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        by: String,
    },
    /// A paused turn runs again.
    Resumed {},
    /// A steer message joined the turn as a user message, before its next model call.
    Steered {
        text: String,
    },
    /// The session's plan changed (`update_plan`, or a step's run started or ended): the whole
    /// plan as it stands.
    PlanUpdated {
        plan: Plan,
    },
    /// A subagent began to run a plan step (`run_plan`).
    PlanStepStarted {
        step_id: String,
        agent: String,
        /// The id of the step's subagent call (its child events carry `subagent:<call_id>`).
        call_id: String,
    },
    /// A plan step's subagent ended.
    PlanStepFinished {
        step_id: String,
        ok: bool,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        worker_id: String,
        duration_ms: u64,
    },
    /// A subagent's child turn ended (source `subagent:<call_id>`): how it ended and the tokens
    /// of its own model calls (the runs under it report theirs on their own `run_ended`).
    RunEnded {
        status: TurnStatus,
        usage: Usage,
    },
    /// A recoverable problem the turn continued past.
    Warning {
        failure: Failure,
    },
    /// Always the last event of a turn.
    Final {
        result: FinalResult,
    },
}

/// A lead's answer to a lookup on `skein.result.{tenant}.{session}.{task_id}`: the task's stored
/// final result, none while the task has not ended, or why the store could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StoredFinal {
    pub v: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<FinalResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// The end of a turn, also stored for later lookup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FinalResult {
    pub v: u32,
    pub task_id: String,
    pub tenant: String,
    pub session: String,
    pub status: TurnStatus,
    /// The answer; only a preview of it (head and tail, with a note) when `answer_ref` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Where the whole answer is stored, when it was too large to travel in the final event or
    /// a lookup's reply (UTF-8 text). `SkeinClient::run` and `stored_final` fetch it and return
    /// the whole answer with this unset.
    // Boxed: rarely set, and every result held in memory would carry its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_ref: Option<Box<PayloadRef>>,
    /// The answer parsed, when the turn had an output schema (a structured answer) and its answer
    /// matched it: `answer` is its JSON text. Left out with a status other than `completed`, and
    /// when the answer travels by reference (see `output_ref`) or was cut to fit a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// True when `output` was left out because the answer travels by reference (`answer_ref`):
    /// the whole answer is the output's JSON. `SkeinClient::run` and `whole_answer` fetch it and
    /// return both whole, with this unset.
    #[serde(default, skip_serializing_if = "is_false")]
    pub output_ref: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// Model calls made in the turn.
    pub iterations: u32,
    /// True when the iteration limit ended the loop and the answer is a summary.
    #[serde(default)]
    pub limit_reached: bool,
    #[serde(default)]
    pub usage: Usage,
    /// The trace the turn is recorded in (32 hex digits), when tracing is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// What the task spent of its budget (its subagents included), when it ran under one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Spent>,
}

impl FinalResult {
    /// This result as it can travel in one message of at most `limit` bytes of JSON: an answer
    /// too long keeps its head, followed by a note of its whole size (the whole answer stays in
    /// the stored result and the session's history).
    pub fn fitted(mut self, limit: usize) -> FinalResult {
        const NOTE_ROOM: usize = 128;
        let whole = self.answer.as_ref().map_or(0, String::len);
        // A structured answer travels twice (its text and its parsed `output`): the parsed
        // copy goes first, the stored result keeps it.
        if self.output.is_some()
            && crate::json_out::encoded_len(&self).map_or(true, |size| size > limit)
        {
            self.output = None;
        }
        let Some(mut answer) = self.answer.take() else {
            return self;
        };
        // Escaping can make JSON longer than its text: cut again by the measured overshoot.
        // Measured without being written: only a result that does not fit costs more.
        for _ in 0..8 {
            self.answer = Some(answer);
            let size = crate::json_out::encoded_len(&self).unwrap_or(usize::MAX);
            if size <= limit {
                return self;
            }
            answer = self.answer.take().unwrap_or_default();
            let keep = answer.len().saturating_sub(size - limit + NOTE_ROOM);
            let head = &answer[..crate::text::floor_char_boundary(&answer, keep)];
            answer = format!(
                "{head}\n[answer cut to fit one message: {whole} bytes in all; the stored result keeps it whole]"
            );
        }
        self.answer = Some(answer);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    Completed,
    Failed,
    /// Stopped by a cancel request (`skein cancel`); the session is left as it was.
    Cancelled,
    /// Stopped because a model call would have gone over the task's budget or its tenant's
    /// daily budget; the answer says what was spent, and the session keeps the turn's messages.
    BudgetExhausted,
    /// Not run: an older task of the session was unfinished and the submission said
    /// `multitask: reject`. The failure (`session_busy`) names the task that holds the session.
    Rejected,
    /// The answer did not match the turn's output schema, also after one repair attempt; the
    /// failure (`invalid_output`) says what was wrong, the answer is the last one the model gave.
    /// The session is left as it was.
    InvalidOutput,
}

impl TurnStatus {
    /// The status as it is written on the wire (`budget_exhausted`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            TurnStatus::Completed => "completed",
            TurnStatus::Failed => "failed",
            TurnStatus::Cancelled => "cancelled",
            TurnStatus::BudgetExhausted => "budget_exhausted",
            TurnStatus::Rejected => "rejected",
            TurnStatus::InvalidOutput => "invalid_output",
        }
    }
}

fn is_false(flag: &bool) -> bool {
    !flag
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn at_most_once(n: &u32) -> bool {
    *n <= 1
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn structured(answer: &str) -> FinalResult {
        FinalResult {
            v: 1,
            task_id: "t".into(),
            tenant: "a".into(),
            session: "s".into(),
            status: TurnStatus::Completed,
            answer: Some(answer.to_owned()),
            answer_ref: None,
            output: serde_json::from_str(answer).ok(),
            output_ref: false,
            failure: None,
            iterations: 1,
            limit_reached: false,
            usage: Usage::default(),
            trace_id: None,
            spent: None,
        }
    }

    #[test]
    fn an_event_is_sent_as_the_json_of_the_event() {
        let kinds = [
            EventKind::ModelDelta {
                text: "a \"quoted\" ünïcödé delta\n".into(),
            },
            EventKind::Warning {
                failure: Failure::new(crate::protocol::FailureKind::TooLarge, "left out"),
            },
            EventKind::Final {
                result: structured("the answer"),
            },
        ];
        for (seq, kind) in kinds.into_iter().enumerate() {
            let event = TurnEvent {
                v: 1,
                task_id: "task-1".into(),
                source: "subagent:call-2".into(),
                seq: (7 << 32) + seq as u64,
                at_ms: 1_700_000_000_000,
                event: kind,
            };
            let sent = serde_json::to_vec(&event.borrowed()).expect("encodes");
            assert_eq!(sent, serde_json::to_vec(&event).expect("encodes"));
            let read: TurnEvent = serde_json::from_slice(&sent).expect("decodes");
            assert_eq!(read, event);
        }
    }

    #[test]
    fn a_structured_answer_too_large_for_a_message_leaves_its_parsed_copy_out_first() {
        let answer = json!({ "text": "x".repeat(500) }).to_string();
        let whole = structured(&answer);
        let fits = whole.clone().fitted(4096);
        assert_eq!(fits, whole, "a result that fits is left whole");

        let size = serde_json::to_vec(&whole).expect("encodes").len();
        let without_output = whole.clone().fitted(size - 100);
        assert_eq!(without_output.output, None);
        assert_eq!(without_output.answer.as_deref(), Some(answer.as_str()));

        let cut = whole.fitted(300);
        assert_eq!(cut.output, None);
        assert!(cut
            .answer
            .as_deref()
            .is_some_and(|a| a.contains("answer cut to fit")));
        assert!(serde_json::to_vec(&cut).expect("encodes").len() <= 300);
        assert!(!serde_json::to_string(&cut)
            .expect("encodes")
            .contains("output"));
    }
}
