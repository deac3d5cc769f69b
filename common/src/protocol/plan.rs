//! A plan as it is stored with a session, checkpointed with a turn and carried by `plan_updated`
//! events: the steps the model keeps (Codex's `update_plan` shape), each optionally run by a
//! subagent on the workers once the steps it waits for (`after`) are completed.
//!
//! Invariants (kept by `agent::plan`, which alone builds plans from a model's arguments): step
//! ids are unique plain tokens, every `after` names another step of the plan, the steps form no
//! cycle, and a step's `outcome`, `worker_id` and `duration_ms` are set only by the runtime when a
//! worker ran it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Failure;

/// The model's plan for a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Plan {
    /// Why the plan is as it is (the model's note with its last update).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub explanation: String,
    /// The steps in the model's order.
    pub plan: Vec<PlanStep>,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlanStep {
    /// Unique within the plan; by default the step's position ("1", "2", …).
    pub id: String,
    /// What the step is about.
    pub step: String,
    pub status: StepStatus,
    /// The subagent that runs the step; absent for a step of the model's own checklist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// What the subagent is asked; absent asks it `step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// Ids of the steps that must be completed before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// How the step's last run ended (a subagent step the runtime ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<StepOutcome>,
    /// The worker that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

impl PlanStep {
    /// What the step's subagent is asked.
    pub fn task(&self) -> &str {
        self.input.as_deref().unwrap_or(&self.step)
    }

    /// Whether a worker finished this step successfully: such a step can no longer change.
    pub fn done_by_worker(&self) -> bool {
        self.status == StepStatus::Completed && matches!(self.outcome, Some(StepOutcome::Answer(_)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    InProgress,
    Completed,
    Cancelled,
    /// Its subagent failed; its dependents stay pending until the model re-plans.
    Failed,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::InProgress => "in_progress",
            StepStatus::Completed => "completed",
            StepStatus::Cancelled => "cancelled",
            StepStatus::Failed => "failed",
        }
    }
}

/// How a subagent step ended: `{"answer": "..."}`, or `{"failure": {kind, message, retryable}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    Answer(String),
    Failure(Failure),
}
