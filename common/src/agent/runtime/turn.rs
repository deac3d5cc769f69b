//! What a turn is given and what it gives back: [`TurnInput`] (the task, the agent, the history,
//! the seams it reports to and resumes from), [`TurnOutput`] (status, answer, new messages, usage,
//! compaction, plan) and [`TurnStop`] (why a turn stopped without an output: suspended for a
//! person, paused, interrupted).

use super::*;

/// What a turn needs to run.
pub struct TurnInput<'a> {
    /// The task and the session this loop runs in (shared with its calls and its event sink).
    pub origin: Arc<TaskOrigin>,
    pub agent: &'a AgentSpec,
    /// The session's history before this turn (after its last compaction).
    pub history: &'a [Message],
    /// The session's summary of what was compacted before `history`.
    pub summary: Option<&'a Summary>,
    /// Skills the session loaded in earlier turns: their bodies stay in the prompt.
    pub loaded_skills: &'a [String],
    /// The session's plan (from earlier turns), if it has one.
    pub plan: Option<&'a Plan>,
    /// The skills this turn may use, when its task carried them (a subagent on a worker);
    /// `None` uses the runtime's catalog.
    pub skills: Option<&'a SkillCatalog>,
    pub input: String,
    /// Images the user's message shows after `input` (checked against the caps at admission;
    /// large ones by payload reference).
    pub input_images: Vec<crate::protocol::ImagePart>,
    /// 0 for a user's turn, n for a subagent n levels down.
    pub depth: u32,
    /// Where the turn's events go (shared with the model service, which streams deltas to it).
    pub events: Arc<dyn EventSink>,
    pub cancel: &'a CancellationToken,
    /// Progress of an earlier run of this turn to continue from (boxed: most turns have none,
    /// and the input is kept for the whole turn).
    pub resume: Option<Box<TurnCheckpoint>>,
    /// True when no earlier run of this turn can have dispatched its calls (its first delivery
    /// and first attempt, nothing to resume). Otherwise each call is looked for among the
    /// recorded results before it is dispatched, and workers look again before running it.
    pub first_run: bool,
    /// Where to record progress before each step's calls are dispatched; `None` records nothing.
    pub checkpoints: Option<&'a dyn CheckpointSink>,
    /// Where answers to approval requests come from; `None` means nobody can answer (a subagent's
    /// loop), so a call that would ask is denied instead.
    pub approvals: Option<&'a dyn ApprovalGate>,
    /// Where pauses, steer messages and interrupts come from; `None`: nobody controls the turn.
    pub controls: Option<&'a dyn TurnControls>,
    /// A replay's record: calls matching a recorded one are answered from it instead of running.
    pub recorded: Option<&'a crate::agent::replay::RecordedCalls>,
}

/// Why a turn stopped without ending.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnStop {
    /// It was cancelled, or its progress could not be recorded (the session lease was lost, or
    /// the store went away). The turn has no result; it may run again.
    Interrupted(Failure),
    /// Calls wait for a person's approval; their `approval_requested` events went out. The turn
    /// runs again (from its checkpoint) once they are answered or expire.
    AwaitingApproval(Awaiting),
    /// A person paused the turn: it stopped at a step boundary, dispatching nothing new. It runs
    /// again (from its checkpoint) once resumed.
    Paused,
}

/// The calls a suspended turn waits on.
#[derive(Debug, Clone, PartialEq)]
pub struct Awaiting {
    pub calls: Vec<PendingCall>,
    /// When unanswered calls are denied (the first request's expiry, from the agent's approval
    /// timeout); `None` waits for ever (or until the task's deadline).
    pub expires_at_ms: Option<u64>,
}

impl TurnStop {
    pub(crate) fn cancelled() -> Self {
        TurnStop::Interrupted(Failure::new(FailureKind::Cancelled, "turn cancelled"))
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutput {
    pub status: TurnStatus,
    pub answer: Option<String>,
    /// The answer parsed, when the agent has an output schema and the answer matched it.
    pub output: Option<serde_json::Value>,
    pub failure: Option<Failure>,
    pub iterations: u32,
    pub limit_reached: bool,
    pub usage: Usage,
    /// Messages this turn adds to the session: the user's input, the model's messages and the
    /// observations.
    pub new_messages: Vec<Message>,
    /// Skills loaded during this turn (they stay loaded for the session's later turns).
    pub loaded_skills: Vec<String>,
    /// Some call of the turn asked for approval: a request may be stored for it (the caller
    /// clears it when the turn ends).
    pub asked_approval: bool,
    /// The history was compacted during the turn: the caller stores the summary with the
    /// session.
    pub compaction: Option<Compaction>,
    /// The session's plan as the turn left it (the session keeps it).
    pub plan: Option<Plan>,
    /// Steer messages the turn took (among `new_messages`).
    pub steered: u32,
    /// When each step that made calls ended (a fork at a step takes the files of then).
    pub step_ends: Vec<StepEnd>,
}

impl TurnOutput {
    pub(super) fn started(input: String, images: Vec<crate::protocol::ImagePart>) -> Self {
        Self {
            status: TurnStatus::Completed,
            answer: None,
            output: None,
            failure: None,
            iterations: 0,
            limit_reached: false,
            usage: Usage::default(),
            new_messages: vec![Message::user(input).with_images(images)],
            loaded_skills: Vec::new(),
            asked_approval: false,
            compaction: None,
            plan: None,
            steered: 0,
            step_ends: Vec::new(),
        }
    }
}
