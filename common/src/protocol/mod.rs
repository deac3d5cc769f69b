//! Wire protocol v1: every message Skein puts on NATS or stores as a result.
//!
//! Invariants:
//! - every top-level message carries `v` (the protocol version) and is plain JSON, so a client in
//!   any language can speak it; the JSON Schemas under `docs/protocol/` are generated from these
//!   types (see [`schemas`]);
//! - identifiers that end up in NATS subjects or Redis keys are validated by [`validate_token`]
//!   before use: they can never inject a wildcard or a separator;
//! - a failure that crosses the wire is data ([`Failure`]: kind, message, retryable), never a Rust
//!   error.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod budget;
pub mod content;
pub mod control;
mod events;
pub mod message;
pub mod output;
pub mod payload;
pub mod permissions;
pub mod plan;
mod registry;

pub use budget::{Budget, BudgetScope, Spent};
pub use content::{ImageLimits, ImagePart, InputPart, SubmissionInput};
pub use control::{ControlAction, RunControl};
pub use events::{EventKind, FinalResult, StoredFinal, TurnEvent, TurnEventRef, TurnStatus};
pub use output::OutputSchema;
pub use payload::PayloadRef;
pub use permissions::{
    approval_key, ApprovalAnswer, ApprovalDecision, ApprovalRequest, PendingCall, PermissionMode,
    PermissionPolicy, ToolEffects, Verdict,
};
pub use plan::{Plan, PlanStep, StepOutcome, StepStatus};
pub use registry::{
    WorkerAnnouncement, MAX_ANNOUNCED_AGENT_TYPES, MAX_ANNOUNCED_TOOLS, MAX_CLOCK_SKEW_MS,
    MAX_HEARTBEAT_EVERY_MS, ROUTABLE_SILENCE_MS,
};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest identifier accepted in subjects and keys.
pub const MAX_TOKEN_LEN: usize = 128;

/// A task submitted by a client: one user turn of one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskSubmission {
    /// Protocol version; must be 1.
    pub v: u32,
    /// Client-chosen id; resubmitting the same id is deduplicated.
    pub task_id: String,
    pub tenant: String,
    pub user: String,
    pub session: String,
    /// Name of the agent definition that runs the turn.
    pub agent: String,
    /// The user's message: a string, or content parts (text, and images by URL or by payload
    /// reference).
    pub input: SubmissionInput,
    /// Per-task overrides of the agent definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<Box<AgentOverrides>>,
    /// Milliseconds since the Unix epoch after which the task must not start, and is stopped if
    /// running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Spending limits of the task and its subagents; each limit is held to the agent's own
    /// (the lower of the two applies). A turn that would go over ends `budget_exhausted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// What the task does when an older task of its session is still unfinished: wait for it
    /// (`enqueue`, the default), end at once (`reject`), stop it keeping its work (`interrupt`)
    /// or cancel it (`rollback`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub multitask: MultitaskPolicy,
    /// Runs the task as a replay of a recorded turn of the tenant's: each tool or subagent call
    /// whose name and arguments match a call that turn made is answered from its record, so no
    /// side effect is repeated; calls that differ run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<ReplayOf>,
    /// The JSON Schema the answer must match (a structured answer); it replaces the agent's own
    /// (`output_schema` of its definition). A schema the validator cannot check refuses the
    /// submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Box<OutputSchema>>,
}

/// The recorded turn a replaying task takes its calls' answers from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayOf {
    pub session: String,
    /// The turn's number in its session (see `skein sessions history`).
    pub turn: u64,
}

/// What a submission does when an older task of its session is still unfinished (the names are
/// LangGraph's `multitask_strategy`). Only older tasks of the same session are affected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MultitaskPolicy {
    /// Wait until the older tasks have ended, then run: a session's turns run in submission
    /// order.
    #[default]
    Enqueue,
    /// End at once with status `rejected` (failure `session_busy`, naming the task that holds the
    /// session); the older tasks run on.
    Reject,
    /// Stop the older tasks at their next step boundary (before their next model call), keeping
    /// their work: each ends `completed`, its messages saved to the session, its answer saying it
    /// was interrupted by this task. Then run.
    Interrupt,
    /// Cancel the older tasks (each ends `cancelled`, its messages not kept, as `skein cancel`
    /// does), then run.
    Rollback,
}

impl MultitaskPolicy {
    pub const ALL: [MultitaskPolicy; 4] = [
        MultitaskPolicy::Enqueue,
        MultitaskPolicy::Reject,
        MultitaskPolicy::Interrupt,
        MultitaskPolicy::Rollback,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MultitaskPolicy::Enqueue => "enqueue",
            MultitaskPolicy::Reject => "reject",
            MultitaskPolicy::Interrupt => "interrupt",
            MultitaskPolicy::Rollback => "rollback",
        }
    }
}

impl std::fmt::Display for MultitaskPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for MultitaskPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|policy| policy.as_str() == text)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|p| p.as_str()).collect();
                format!("{text:?} is not one of {}", names.join(", "))
            })
    }
}

/// Fields of an agent definition a single task may override.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Replaces the tool allowlist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
    /// Tightens the agent's permissions for this task: a stricter mode, more `ask` and `deny`
    /// rules, a shorter approval timeout. Anything that would loosen them (a looser mode, `allow`
    /// rules) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<PermissionPolicy>,
}

/// A request to stop a task, published on `skein.cancel.{tenant}.{task_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CancelRequest {
    pub v: u32,
    pub tenant: String,
    pub task_id: String,
    /// Why, for the record.
    #[serde(default)]
    pub reason: String,
    /// Stop only this subagent run of the task (the call that started it, as its events'
    /// source names it) and the runs under it; its caller observes `stopped` and goes on.
    /// Published on `skein.cancel.{tenant}.{task_id}.{call_id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// Who a piece of work belongs to; travels with every task so workers stay stateless.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskOrigin {
    pub task_id: String,
    pub tenant: String,
    pub user: String,
    /// The session the call belongs to (a child session for subagent calls).
    pub session: String,
    /// The session whose workspace files the call works in: the user's session, also for the
    /// calls of its subagents.
    pub workspace: String,
    /// The task's deadline (milliseconds since the Unix epoch): expired work is not started, and
    /// no call runs past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// The budget the work's model calls draw from (the user's task's, also for its
    /// subagents); absent when the task has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetScope>,
    /// The budget of the subagent run the work belongs to (its agent's own `[budget]`, its
    /// ledger in the child session), drawn from besides `budget`; inherited by its own
    /// subagents unless they have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_budget: Option<BudgetScope>,
}

impl TaskOrigin {
    /// Time left before the deadline (`None` without one; zero once it passed).
    pub fn time_left(&self) -> Option<std::time::Duration> {
        self.deadline_ms
            .map(|deadline| std::time::Duration::from_millis(deadline.saturating_sub(now_ms())))
    }
}

/// One tool call dispatched to a worker pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolTask {
    pub v: u32,
    /// The task and session the call belongs to.
    // Shared: a dispatching lead's calls of one turn point at the turn's own.
    pub origin: Arc<TaskOrigin>,
    /// The model's id of the call.
    pub call_id: String,
    /// The key the result is recorded under (see [`call_key`]); recorded once per key.
    pub call_key: String,
    pub tool: String,
    /// The call's arguments; `null` when they travel by reference (`arguments_ref`).
    pub arguments: Value,
    /// Where the arguments are stored when they were too large to travel inline (JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_ref: Option<PayloadRef>,
    /// Core NATS subject the result is published to (under `skein.reply.`).
    pub reply_to: String,
    /// How long the worker may run the call, in milliseconds.
    pub timeout_ms: u64,
    /// True when the dispatcher knows of no earlier dispatch of this call (its turn did not
    /// resume): the first delivery of such a task cannot have a recorded result or an earlier
    /// attempt, so a worker runs it without asking the store first. Absent means false.
    #[serde(default)]
    pub first_dispatch: bool,
}

/// A subtask handed to a child agent that a worker runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SubagentTask {
    pub v: u32,
    /// Origin of the parent turn; `origin.session` is the parent session.
    pub origin: Arc<TaskOrigin>,
    pub call_id: String,
    /// The key the result is recorded under (see [`call_key`]).
    pub call_key: String,
    /// The child session, derived from the parent's by [`child_session_id`].
    pub child_session: String,
    /// The complete definition of the child agent, so any worker can run it.
    pub agent: AgentSpec,
    /// The child's task; empty when it travels by reference (`input_ref`).
    pub input: String,
    /// Where the input is stored when it was too large to travel inline (UTF-8 text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ref: Option<PayloadRef>,
    pub reply_to: String,
    pub timeout_ms: u64,
    /// Nesting depth of the child (1 for a direct child of the user's agent).
    pub depth: u32,
    /// True when the dispatcher knows of no earlier dispatch of this call (its turn did not
    /// resume): the first delivery of such a task cannot have a recorded result or an earlier
    /// attempt, so a worker runs it without asking the store first. Absent means false.
    #[serde(default)]
    pub first_dispatch: bool,
    /// The skills the child may load (its definition's `skills`, all of the lead's by default),
    /// so a worker without the agents folder offers them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<SkillDocument>,
}

/// A skill as it travels to the worker that runs a subagent: its catalog entry, body and
/// resource files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SkillDocument {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub body: String,
    /// Resource files: path relative to the skill's folder, and text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<SkillResource>,
}

/// One resource file of a skill.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct SkillResource {
    pub path: String,
    pub content: String,
}

/// An agent definition as it travels on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub system_prompt: String,
    /// Model name; empty means the process default.
    #[serde(default)]
    pub model: String,
    /// Tool allowlist; `["*"]` allows every live tool.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Subagents this agent may spawn.
    #[serde(default)]
    pub subagents: Vec<AgentSpec>,
    pub max_iterations: u32,
    /// Permission rules for its tool calls.
    #[serde(default, skip_serializing_if = "is_default")]
    pub permissions: PermissionPolicy,
    /// Skills it may load by name; absent allows every skill of the catalog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<Vec<String>>,
    /// The model's context size in tokens; absent uses what is known of the model (or the
    /// process default). The history is compacted before a request would fill most of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u64>,
    /// Models tried in order when `model` fails after its retries (unreachable, overloaded,
    /// refusing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// Offers the plan tools (`update_plan`, `read_plan`, and `run_plan` when it has subagents).
    #[serde(default, skip_serializing_if = "is_default")]
    pub planning: bool,
    /// Most plan steps `run_plan` runs at once; absent uses the runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_steps: Option<u32>,
    /// Most runs of this agent as a subagent at once across the cluster (workers hold the count
    /// in Redis); absent for no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// The agent's own `[budget]`: as a subagent, its run spends at most this (and no more than
    /// what is left of its root task's budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The JSON Schema its final answer must match (a structured answer): checked when the turn
    /// ends, repaired once, else the turn ends `invalid_output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<OutputSchema>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The outcome of one tool or subagent call, returned to the dispatcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolResult {
    pub v: u32,
    pub call_id: String,
    pub outcome: CallOutcome,
    /// Id of the worker that ran the call (empty when it never reached one).
    #[serde(default)]
    pub worker_id: String,
    #[serde(default)]
    pub duration_ms: u64,
    /// How often the broker had delivered the call to a worker when this result came from one
    /// (1: the first delivery ran it; more: earlier deliveries went unanswered, their worker gone
    /// or timed out); 0 when no worker ran it (answered at the lead, or unknown). Left out of the
    /// JSON while at most 1.
    #[serde(default, skip_serializing_if = "at_most_once")]
    pub attempts: u32,
}

fn at_most_once(attempts: &u32) -> bool {
    *attempts <= 1
}

/// Success output or failure of a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CallOutcome {
    Ok {
        output: String,
        /// Images the call returned (an MCP tool's image content), stored by reference;
        /// absent when there are none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImagePart>,
    },
    Failed {
        failure: Failure,
    },
}

impl CallOutcome {
    /// The text the model observes for this outcome.
    pub fn observation(&self) -> String {
        match self {
            CallOutcome::Ok { output, .. } => output.clone(),
            CallOutcome::Failed { failure } => {
                format!("error ({}): {}", failure.kind.as_str(), failure.message)
            }
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, CallOutcome::Ok { .. })
    }

    /// A success with `output` and no images.
    pub fn ok(output: impl Into<String>) -> Self {
        CallOutcome::Ok {
            output: output.into(),
            images: Vec::new(),
        }
    }

    /// The images the model observes with this outcome (none for a failure).
    pub fn images(&self) -> &[ImagePart] {
        match self {
            CallOutcome::Ok { images, .. } => images,
            CallOutcome::Failed { .. } => &[],
        }
    }
}

/// A failure as protocol data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
    pub retryable: bool,
}

/// Longest failure message, in bytes: a failure can echo outside input, and it travels in
/// events, results, dead-letter headers and model context.
pub const MAX_FAILURE_MESSAGE: usize = 4096;

impl Failure {
    /// A failure of `kind`; its message is cut to [`MAX_FAILURE_MESSAGE`] bytes.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = if message.len() > MAX_FAILURE_MESSAGE {
            crate::text::cut(&message, MAX_FAILURE_MESSAGE)
        } else {
            message
        };
        Self {
            retryable: kind.default_retryable(),
            kind,
            message,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

/// What went wrong, named by condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The message could not be decoded or broke a protocol rule.
    InvalidInput,
    /// The payload exceeds a size cap.
    TooLarge,
    UnknownAgent,
    UnknownTool,
    /// Tool arguments do not match the tool's schema.
    InvalidArguments,
    /// A policy refused the call (workspace escape, host not allowed...).
    Denied,
    TimedOut,
    /// A dependency (model, NATS, Redis, a tool's upstream) could not be reached.
    Unavailable,
    /// The tool ran and reported an error.
    ToolFailed,
    /// The model call failed or answered something unusable.
    ModelFailed,
    /// The turn's answer did not match its output schema, also after one repair attempt.
    InvalidOutput,
    /// A model call would go over the task's budget or its tenant's daily budget.
    BudgetExhausted,
    /// The request is longer than the model's context: the model refused it, or its latest step
    /// alone does not fit, with nothing left to compact.
    ContextOverflow,
    Cancelled,
    /// A cancel request for this subagent run alone stopped it; the task goes on.
    Stopped,
    /// An older task of the session was still unfinished and the submission asked not to wait
    /// (`multitask: reject`).
    SessionBusy,
    /// The work failed on every attempt and was set aside in the dead-letter stream.
    DeadLettered,
    Internal,
    /// A kind this build does not know (sent by a newer peer).
    #[serde(other)]
    Unknown,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::InvalidInput => "invalid_input",
            FailureKind::TooLarge => "too_large",
            FailureKind::UnknownAgent => "unknown_agent",
            FailureKind::UnknownTool => "unknown_tool",
            FailureKind::InvalidArguments => "invalid_arguments",
            FailureKind::Denied => "denied",
            FailureKind::TimedOut => "timed_out",
            FailureKind::Unavailable => "unavailable",
            FailureKind::ToolFailed => "tool_failed",
            FailureKind::ModelFailed => "model_failed",
            FailureKind::InvalidOutput => "invalid_output",
            FailureKind::BudgetExhausted => "budget_exhausted",
            FailureKind::ContextOverflow => "context_overflow",
            FailureKind::Cancelled => "cancelled",
            FailureKind::Stopped => "stopped",
            FailureKind::SessionBusy => "session_busy",
            FailureKind::DeadLettered => "dead_lettered",
            FailureKind::Internal => "internal",
            FailureKind::Unknown => "unknown",
        }
    }

    /// Whether trying the same work again may succeed.
    pub fn default_retryable(self) -> bool {
        matches!(
            self,
            FailureKind::TimedOut | FailureKind::Unavailable | FailureKind::SessionBusy
        )
    }
}

/// What the model sees of a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
    /// False when calls of this tool must not run alongside each other.
    #[serde(default = "yes")]
    pub concurrency_safe: bool,
    /// What the tool declares about its effects (read-only, destructive, edits the workspace).
    #[serde(default, skip_serializing_if = "is_default")]
    pub effects: ToolEffects,
}

fn yes() -> bool {
    true
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Checks that `value` may be used as one token of a subject or key: 1 to 128 characters of
/// `A-Z a-z 0-9 _ -`.
pub fn validate_token(field: &str, value: &str) -> Result<(), Failure> {
    let ok = !value.is_empty()
        && value.len() <= MAX_TOKEN_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Failure::new(
            FailureKind::InvalidInput,
            format!(
                "{field} must be 1-{MAX_TOKEN_LEN} characters of A-Z a-z 0-9 _ - (got {:?})",
                crate::text::cut(value, 2 * MAX_TOKEN_LEN)
            ),
        ))
    }
}

impl TaskSubmission {
    /// Checks protocol rules beyond what decoding enforces.
    pub fn validate(&self, max_input_bytes: usize) -> Result<(), Failure> {
        if self.v != PROTOCOL_VERSION {
            return Err(Failure::new(
                FailureKind::InvalidInput,
                format!(
                    "unsupported protocol version {} (this build speaks {PROTOCOL_VERSION})",
                    self.v
                ),
            ));
        }
        validate_token("task_id", &self.task_id)?;
        validate_token("tenant", &self.tenant)?;
        validate_token("user", &self.user)?;
        validate_token("session", &self.session)?;
        validate_token("agent", &self.agent)?;
        if let Some(replayed) = &self.replay_of {
            validate_token("replay_of.session", &replayed.session)?;
        }
        if self.input.len() > max_input_bytes {
            return Err(Failure::new(
                FailureKind::TooLarge,
                format!(
                    "input is {} bytes; the limit is {max_input_bytes}",
                    self.input.len()
                ),
            ));
        }
        if self.input.is_empty() {
            return Err(Failure::new(FailureKind::InvalidInput, "input is empty"));
        }
        if let Some(budget) = &self.budget {
            budget.check()?;
        }
        if let Some(schema) = &self.output_schema {
            schema.check("output_schema")?;
        }
        Ok(())
    }

    /// The input's images, checked: each part well-formed, within `limits`, and an image by
    /// reference stored for this submission's tenant and session.
    pub fn images(&self, limits: &ImageLimits) -> Result<Vec<ImagePart>, Failure> {
        let images = self.input.images()?;
        limits.check("the input", &images)?;
        let bucket = format!("{}{}", payload::PAYLOAD_BUCKET_PREFIX, self.tenant);
        let session = format!("{}/", self.session);
        for image in &images {
            if let ImagePart::Payload { payload, .. } = image {
                if payload.bucket != bucket || !payload.name.starts_with(&session) {
                    return Err(Failure::new(
                        FailureKind::Denied,
                        format!(
                            "an image by reference must be stored in bucket {bucket} under \
                             {session} (got {:?} in {:?})",
                            crate::text::cut(&payload.name, 128),
                            crate::text::cut(&payload.bucket, 128)
                        ),
                    ));
                }
            }
        }
        Ok(images)
    }

    /// The budget the task runs under: its own, each limit held to `agent_default`'s (the
    /// agent definition's `budget`); `None` when neither sets a limit.
    pub fn budget_scope(&self, agent_default: Option<&Budget>) -> Option<BudgetScope> {
        Budget::tightest(agent_default, self.budget.as_ref()).map(|limits| BudgetScope {
            task_id: self.task_id.clone(),
            session: self.session.clone(),
            limits,
        })
    }

    pub fn origin(&self) -> TaskOrigin {
        TaskOrigin {
            task_id: self.task_id.clone(),
            tenant: self.tenant.clone(),
            user: self.user.clone(),
            session: self.session.clone(),
            workspace: self.session.clone(),
            deadline_ms: self.deadline_ms,
            budget: self.budget_scope(None),
            run_budget: None,
        }
    }
}

/// The session id of a subagent call: stable for a given parent session and call, and a valid token.
pub fn child_session_id(parent_session: &str, call_id: &str) -> String {
    let mut id = format!("{parent_session}-sub-{call_id}");
    id.retain(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if id.len() > MAX_TOKEN_LEN {
        // Keep the tail (the call id) unique; the prefix only aids reading.
        id = id.split_off(id.len() - MAX_TOKEN_LEN);
    }
    id
}

/// The `source` of a subagent run's events: `subagent:<call id>` for a child of the user's turn,
/// `subagent:<parent call>/<call id>` one level down, and so on — so every child names its parent
/// (the source without its last segment; `lead` for a first-level child), even where models
/// reuse call ids at every level. The ancestors come from the child session's id (the user's
/// session, then `-sub-<call>` per level); a session id cut to its last 128 characters leaves
/// only the call id.
pub fn child_event_source(workspace: &str, child_session: &str, call_id: &str) -> String {
    let mut calls = ancestor_calls(workspace, child_session);
    // The session's last call is this one (as its id reads in a session id): the raw id names it.
    calls.pop();
    calls.push(call_id);
    format!("subagent:{}", calls.join("/"))
}

/// The calls that led to a session, outermost first: none for the user's session (or a child
/// session cut to its last 128 characters, whose lineage is lost), `[c1]` for `{user}-sub-c1`,
/// `[c1, c2]` one level down.
pub fn ancestor_calls<'a>(workspace: &str, session: &'a str) -> Vec<&'a str> {
    session
        .strip_prefix(workspace)
        .and_then(|rest| rest.strip_prefix("-sub-"))
        .map(|lineage| lineage.split("-sub-").collect())
        .unwrap_or_default()
}

/// The key a call's result is recorded under in its session: unique across the session's turns
/// and the steps of a turn (models may reuse call ids from step to step), and the same when a
/// step is run again.
pub fn call_key(task_id: &str, step: u32, call_id: &str) -> String {
    crate::text::joined_with_number(&[task_id, ":", ":", call_id], 2, u64::from(step))
}

/// Longest `call_key` a worker accepts.
pub const MAX_CALL_KEY_LEN: usize = 512;

/// JSON Schemas of every public message, by file name.
pub fn schemas() -> Vec<(&'static str, Value)> {
    fn schema<T: JsonSchema>() -> Value {
        serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null)
    }
    vec![
        ("task-submission.json", schema::<TaskSubmission>()),
        ("tool-task.json", schema::<ToolTask>()),
        ("subagent-task.json", schema::<SubagentTask>()),
        ("tool-result.json", schema::<ToolResult>()),
        ("turn-event.json", schema::<TurnEvent>()),
        ("final-result.json", schema::<FinalResult>()),
        ("failure.json", schema::<Failure>()),
        ("cancel-request.json", schema::<CancelRequest>()),
        ("worker-announcement.json", schema::<WorkerAnnouncement>()),
        ("approval-decision.json", schema::<ApprovalDecision>()),
        ("approval-request.json", schema::<ApprovalRequest>()),
        ("run-control.json", schema::<RunControl>()),
        ("stored-final.json", schema::<StoredFinal>()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_reject_subject_metacharacters() {
        for bad in ["", "a.b", "a*", ">", "a b", "ä", &"x".repeat(129)] {
            assert!(validate_token("t", bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "A-b_9", &"x".repeat(128)] {
            assert!(validate_token("t", good).is_ok(), "{good:?} rejected");
        }
    }

    #[test]
    fn turn_statuses_name_themselves_as_on_the_wire() {
        use TurnStatus::*;
        for status in [
            Completed,
            Failed,
            Cancelled,
            BudgetExhausted,
            Rejected,
            InvalidOutput,
        ] {
            let wire = serde_json::to_value(status).expect("encodes");
            assert_eq!(wire.as_str(), Some(status.as_str()));
        }
    }

    #[test]
    fn announcements_name_agent_types_compatibly() {
        let older = r#"{"v":1,"worker_id":"w1","pool":"p","version":"0","tools":[],"runs_subagents":true,"capacity":1,"heartbeat_ms":0,"heartbeat_every_ms":1000}"#;
        let every: WorkerAnnouncement = serde_json::from_str(older).expect("decodes");
        assert_eq!(every.agent_types, None);
        assert!(every.runs_agent("researcher"), "no list: every type");
        assert!(
            !serde_json::to_string(&every)
                .expect("encodes")
                .contains("agent_types"),
            "a worker of every type announces as before"
        );
        let listing = WorkerAnnouncement {
            agent_types: Some(vec!["researcher".into()]),
            ..every.clone()
        };
        assert!(listing.runs_agent("researcher"));
        assert!(!listing.runs_agent("writer"));
        assert!(listing.check().is_ok());
        let none = WorkerAnnouncement {
            runs_subagents: false,
            ..every
        };
        assert!(!none.runs_agent("researcher"));
        let forged = WorkerAnnouncement {
            agent_types: Some(vec!["x.>".into()]),
            ..listing.clone()
        };
        assert!(forged.check().is_err(), "a type that is not a token");
        let too_many = WorkerAnnouncement {
            agent_types: Some(vec!["a".into(); MAX_ANNOUNCED_AGENT_TYPES + 1]),
            ..listing
        };
        assert!(too_many.check().is_err());
    }

    #[test]
    fn child_event_sources_name_their_parents() {
        let first = child_session_id("s1", "c1");
        assert_eq!(child_event_source("s1", &first, "c1"), "subagent:c1");
        let second = child_session_id(&first, "c1");
        assert_eq!(child_event_source("s1", &second, "c1"), "subagent:c1/c1");
        let third = child_session_id(&second, "c9");
        assert_eq!(child_event_source("s1", &third, "c9"), "subagent:c1/c1/c9");
        // Cut to its tail: only the call id is left to name it.
        let long = child_session_id(&"p".repeat(130), "c2");
        assert_eq!(
            child_event_source(&"p".repeat(130), &long, "c2"),
            "subagent:c2"
        );
    }

    #[test]
    fn child_session_is_a_valid_token_and_stable() {
        let a = child_session_id("s1", "call_7");
        assert_eq!(a, child_session_id("s1", "call_7"));
        assert_ne!(a, child_session_id("s1", "call_8"));
        assert!(validate_token("s", &a).is_ok());
        let long = child_session_id(&"p".repeat(120), "call.9!");
        assert!(validate_token("s", &long).is_ok());
        assert!(long.ends_with("call9"));
    }

    /// The schemas under `docs/protocol/` are what this build speaks. Regenerate them with
    /// `SKEIN_UPDATE_SCHEMAS=1 cargo test -p skein-common published_schemas`.
    #[test]
    fn published_schemas_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/protocol");
        let update = std::env::var_os("SKEIN_UPDATE_SCHEMAS").is_some();
        for (file, schema) in schemas() {
            let text = serde_json::to_string_pretty(&schema).expect("schemas serialize") + "\n";
            let path = dir.join(file);
            if update {
                std::fs::create_dir_all(&dir).expect("docs/protocol can be created");
                std::fs::write(&path, &text).expect("schema file can be written");
            }
            let published = std::fs::read_to_string(&path).unwrap_or_default();
            assert_eq!(
                published, text,
                "{file} is stale; regenerate with SKEIN_UPDATE_SCHEMAS=1"
            );
        }
    }

    #[test]
    fn multitask_is_enqueue_unless_named_and_only_named_when_not() {
        let plain = r#"{"v":1,"task_id":"t","tenant":"a","user":"u","session":"s","agent":"x","input":"hi"}"#;
        let submission: TaskSubmission = serde_json::from_str(plain).expect("decodes");
        assert_eq!(submission.multitask, MultitaskPolicy::Enqueue);
        let json = serde_json::to_string(&submission).expect("encodes");
        assert!(
            !json.contains("multitask"),
            "the default is not written: {json}"
        );
        for policy in MultitaskPolicy::ALL {
            let named = plain.replace("}", &format!(r#","multitask":"{policy}"}}"#));
            let decoded: TaskSubmission = serde_json::from_str(&named).expect("decodes");
            assert_eq!(decoded.multitask, policy);
            assert_eq!(policy.as_str().parse::<MultitaskPolicy>(), Ok(policy));
        }
        let unknown = plain.replace("}", r#","multitask":"later"}"#);
        assert!(serde_json::from_str::<TaskSubmission>(&unknown).is_err());
        assert!("later".parse::<MultitaskPolicy>().is_err());
    }

    #[test]
    fn unknown_failure_kinds_decode() {
        let f: Failure =
            serde_json::from_str(r#"{"kind":"from_the_future","message":"m","retryable":false}"#)
                .expect("decodes");
        assert_eq!(f.kind, FailureKind::Unknown);
    }

    #[test]
    fn a_submissions_images_are_checked_against_the_caps_and_its_session() {
        let parts = |name: &str, size: u64| {
            serde_json::json!({"v":1,"task_id":"t","tenant":"acme","user":"u","session":"s1",
                "agent":"x","input":[
                    {"type":"text","text":"look"},
                    {"type":"image","media_type":"image/png","payload":{
                        "bucket":"skein-payloads-acme","name":name,"size":size,"digest":"d"}}]})
        };
        let limits = ImageLimits {
            max_image_bytes: 1000,
            max_images: 4,
        };
        let own: TaskSubmission = serde_json::from_value(parts("s1/t/abc", 10)).expect("decodes");
        assert!(own.validate(1024).is_ok());
        assert_eq!(own.images(&limits).map(|i| i.len()), Ok(1));
        let other: TaskSubmission = serde_json::from_value(parts("s2/t/abc", 10)).expect("decodes");
        let refused = other.images(&limits).expect_err("another session's value");
        assert_eq!(refused.kind, FailureKind::Denied);
        assert!(refused.message.contains("under s1/"), "{}", refused.message);
        let large: TaskSubmission =
            serde_json::from_value(parts("s1/t/abc", 1001)).expect("decodes");
        assert_eq!(
            large.images(&limits).map_err(|f| f.kind),
            Err(FailureKind::TooLarge)
        );
    }

    #[test]
    fn submission_rules() {
        let mut s = TaskSubmission {
            replay_of: None,
            v: 1,
            task_id: "t1".into(),
            tenant: "acme".into(),
            user: "u".into(),
            session: "s".into(),
            agent: "assistant".into(),
            input: "hi".into(),
            overrides: None,
            deadline_ms: None,
            budget: None,
            multitask: MultitaskPolicy::Enqueue,
            output_schema: None,
        };
        assert!(s.validate(10).is_ok());
        s.input = "x".repeat(11).into();
        assert_eq!(
            s.validate(10).map_err(|f| f.kind),
            Err(FailureKind::TooLarge)
        );
        s.input = "hi".into();
        s.v = 2;
        assert_eq!(
            s.validate(10).map_err(|f| f.kind),
            Err(FailureKind::InvalidInput)
        );
        s.v = 1;
        s.budget = Some(Budget {
            max_total_tokens: Some(0),
            max_cost_usd: None,
        });
        assert_eq!(
            s.validate(10).map_err(|f| f.kind),
            Err(FailureKind::InvalidInput)
        );
        s.budget = None;
        s.output_schema = Some(Box::new(OutputSchema::new(
            serde_json::json!({"type": "object", "properties": {"n": {"type": "int"}}}),
        )));
        let refused = s.validate(10).expect_err("a schema that does not compile");
        assert_eq!(refused.kind, FailureKind::InvalidInput);
        assert!(
            refused
                .message
                .starts_with("output_schema: at #/properties/n/type"),
            "{refused}"
        );
        s.output_schema = Some(Box::new(OutputSchema::new(
            serde_json::json!({"type": "object"}),
        )));
        assert!(s.validate(10).is_ok());
    }
}
