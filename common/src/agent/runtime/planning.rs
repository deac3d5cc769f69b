//! The plan tools of a turn: `update_plan` (the whole plan, Codex's shape plus `id`, `agent`,
//! `input` and `after`), `read_plan`, and `run_plan`, which runs the plan's subagent steps as a
//! DAG across the workers.
//!
//! The plan lives on a [`PlanBoard`] for the turn's length: it starts from the turn's checkpoint
//! (or the session's plan) and goes into every checkpoint and the turn's output, so a resumed
//! turn sees the plan as it was before the step it repeats. Both tools are deterministic in that
//! plan: `update_plan` makes the same revision again, and `run_plan` asks for the same subagent
//! calls (call id `{run_plan call id}-{step id}`), whose recorded results come back without
//! running them again and whose running copies are waited for, as for any call (4.4).
//!
//! `run_plan` starts each ready step (its `after` steps completed) as soon as a slot of its
//! parallelism is free, until nothing more can start. Every step's subagent call is decided by
//! the permission policy as a `spawn_agent` call would be: a denied step fails; a step that asks
//! waits for a person, and once nothing else can start the turn is suspended for it (the step's
//! call id is the one to answer); the steps that ran meanwhile are recorded, so the resumed
//! turn does not run them again.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::acting::Acting;
use super::{Awaiting, SPAWN_TOOL};
use crate::agent::permissions::{approved_for_session, decide, Decision};
use crate::agent::plan::{self, DEFAULT_MAX_PARALLEL};
use crate::agent::seams::{failure_from_error, Answers, ToolCallRequest};
use crate::protocol::message::ToolCall;
use crate::protocol::{
    now_ms, AgentSpec, CallOutcome, EventKind, Failure, FailureKind, PendingCall, Plan,
    StepOutcome, StepStatus, ToolEffects, ToolSpec,
};

/// Writes the whole plan.
pub const UPDATE_PLAN_TOOL: &str = "update_plan";
/// Returns the plan with each step's status, outcome and worker.
pub const READ_PLAN_TOOL: &str = "read_plan";
/// Runs the plan's ready subagent steps on the workers.
pub const RUN_PLAN_TOOL: &str = "run_plan";

/// Whether `name` is one of the plan tools.
pub(super) fn is_plan_tool(name: &str) -> bool {
    matches!(name, UPDATE_PLAN_TOOL | READ_PLAN_TOOL | RUN_PLAN_TOOL)
}

/// The turn's plan while its calls run, and a suspension `run_plan` asked for.
pub(super) struct PlanBoard {
    plan: Mutex<Option<Plan>>,
    suspended: Mutex<Option<Awaiting>>,
}

impl PlanBoard {
    pub fn new(plan: Option<Plan>) -> Self {
        Self {
            plan: Mutex::new(plan),
            suspended: Mutex::new(None),
        }
    }

    /// The plan as it stands.
    pub fn current(&self) -> Option<Plan> {
        self.plan.lock().map(|p| p.clone()).unwrap_or_default()
    }

    fn set(&self, plan: Plan) {
        if let Ok(mut held) = self.plan.lock() {
            *held = Some(plan);
        }
    }

    /// The suspension `run_plan` asked for, if any (taken once).
    pub fn take_suspension(&self) -> Option<Awaiting> {
        self.suspended.lock().ok().and_then(|mut s| s.take())
    }

    fn suspend(&self, awaiting: Awaiting) {
        if let Ok(mut held) = self.suspended.lock() {
            *held = Some(awaiting);
        }
    }
}

/// The plan tools an agent's turn offers: none unless it plans; `run_plan` only when it has
/// subagents it may spawn.
pub(super) fn plan_tool_specs(agent: &AgentSpec, may_spawn: bool) -> Vec<ToolSpec> {
    if !agent.planning {
        return Vec::new();
    }
    let names: Vec<&str> = if may_spawn {
        agent.subagents.iter().map(|s| s.name.as_str()).collect()
    } else {
        Vec::new()
    };
    let mut step = json!({
        "type": "object",
        "properties": {
            "step": { "type": "string", "description": "What the step does." },
            "status": { "type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"] },
            "id": { "type": "string", "description": "Unique id (default: the step's position, \"1\", \"2\", …)." },
            "after": { "type": "array", "items": { "type": "string" }, "description": "Ids of the steps that must be completed first." }
        },
        "required": ["step", "status"],
        "additionalProperties": false
    });
    if !names.is_empty() {
        step["properties"]["agent"] = json!({ "type": "string", "enum": names, "description": "A subagent that runs the step when run_plan is called." });
        step["properties"]["input"] = json!({ "type": "string", "description": "What the subagent is asked (default: the step's text)." });
    }
    let mut specs = vec![
        ToolSpec {
            name: UPDATE_PLAN_TOOL.into(),
            description: "Write your plan for the task: the whole list of steps with their \
                          status. A step a worker completed cannot be changed (it may be dropped)."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "explanation": { "type": "string" },
                    "plan": { "type": "array", "items": step }
                },
                "required": ["plan"],
                "additionalProperties": false
            }),
            // Plan tools change the turn's plan: they run alone, in the model's order.
            concurrency_safe: false,
            effects: ToolEffects::default(),
        },
        ToolSpec {
            name: READ_PLAN_TOOL.into(),
            description: "Read the plan: each step's status, outcome and the worker that ran it."
                .into(),
            parameters: json!({ "type": "object", "properties": {}, "additionalProperties": false }),
            concurrency_safe: false,
            effects: ToolEffects {
                read_only: true,
                ..Default::default()
            },
        },
    ];
    if !names.is_empty() {
        specs.push(ToolSpec {
            name: RUN_PLAN_TOOL.into(),
            description: "Run every pending plan step that names an agent, each as soon as the \
                          steps it waits for are completed, several at once; returns every \
                          step's outcome. A failed step leaves the steps after it pending."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "max_parallel": { "type": "integer", "minimum": 1, "description": "Most steps running at once." }
                },
                "additionalProperties": false
            }),
            concurrency_safe: false,
            effects: ToolEffects::default(),
        });
    }
    specs
}

impl Acting<'_, '_> {
    /// Runs one plan tool call.
    pub(super) async fn plan_tool(&self, step: u32, call: &ToolCall) -> CallOutcome {
        let result = match call.name.as_str() {
            UPDATE_PLAN_TOOL => self.update_plan(&call.arguments).await,
            READ_PLAN_TOOL => Ok(self.read_plan()),
            _ => self.run_plan(step, call).await,
        };
        match result {
            Ok(output) => CallOutcome::ok(output),
            Err(failure) => CallOutcome::Failed { failure },
        }
    }

    fn subagent_names(&self) -> Vec<&str> {
        if self.turn.depth < self.runtime.settings.max_depth {
            self.turn
                .agent
                .subagents
                .iter()
                .map(|s| s.name.as_str())
                .collect()
        } else {
            Vec::new()
        }
    }

    async fn update_plan(&self, arguments: &Value) -> Result<String, Failure> {
        let current = self.board.current();
        let revised =
            plan::revise(current.as_ref(), arguments, &self.subagent_names()).map_err(|why| {
                Failure::new(
                    FailureKind::InvalidArguments,
                    format!("{UPDATE_PLAN_TOOL}: {why}; the plan was not changed"),
                )
            })?;
        let summary = format!(
            "Plan updated: {} steps ({} to run with run_plan).",
            revised.plan.len(),
            revised.plan.iter().filter(|s| plan::runnable(s)).count()
        );
        self.board.set(revised.clone());
        self.turn
            .events
            .emit(EventKind::PlanUpdated { plan: revised })
            .await;
        Ok(summary)
    }

    fn read_plan(&self) -> String {
        match self.board.current() {
            Some(plan) => serde_json::to_string(&plan).unwrap_or_default(),
            None => "There is no plan yet; write one with update_plan.".into(),
        }
    }

    async fn run_plan(&self, step: u32, call: &ToolCall) -> Result<String, Failure> {
        let invalid = |message: String| {
            Failure::new(
                FailureKind::InvalidArguments,
                format!("{RUN_PLAN_TOOL}: {message}; expected {{\"max_parallel\"?: integer ≥ 1}}"),
            )
        };
        let object = call
            .arguments
            .as_object()
            .ok_or_else(|| invalid("arguments are not an object".into()))?;
        if let Some(extra) = object.keys().find(|k| *k != "max_parallel") {
            return Err(invalid(format!("unknown field {extra:?}")));
        }
        let cap = self
            .turn
            .agent
            .max_parallel_steps
            .unwrap_or(DEFAULT_MAX_PARALLEL)
            .max(1);
        let limit = match object.get("max_parallel") {
            None | Some(Value::Null) => cap,
            Some(value) => match value.as_u64() {
                Some(n) if n >= 1 => (n.min(u64::from(cap))) as u32,
                _ => {
                    return Err(invalid(format!(
                        "max_parallel must be a positive integer, not {value}"
                    )))
                }
            },
        } as usize;
        let Some(mut plan) = self.board.current() else {
            return Err(Failure::new(
                FailureKind::InvalidInput,
                format!("{RUN_PLAN_TOOL}: there is no plan; write one with {UPDATE_PLAN_TOOL}"),
            ));
        };
        // Refused whole only when no runnable step's agent runs anywhere; a step whose agent
        // alone has no worker fails by itself (`spawn_target`).
        let runs_somewhere = |s: &crate::protocol::PlanStep| {
            (s.agent.as_deref()).is_some_and(|a| self.catalog.pool_for_subagent(a).is_some())
        };
        if plan.plan.iter().any(plan::runnable)
            && !plan
                .plan
                .iter()
                .filter(|s| plan::runnable(s))
                .any(runs_somewhere)
        {
            return Err(Failure::new(
                FailureKind::Unavailable,
                "no live worker runs subagents",
            ));
        }

        let mut answers: Option<Answers> = None;
        let mut waiting: Vec<PendingCall> = Vec::new();
        let mut started: HashSet<usize> = HashSet::new();
        let mut running = FuturesUnordered::new();
        loop {
            for index in plan::ready(&plan, &started) {
                if running.len() >= limit {
                    break;
                }
                started.insert(index);
                let step_call = self.step_call(call, &plan.plan[index]);
                match self.step_permission(&step_call, &mut answers).await {
                    StepVerdict::Runs => {}
                    StepVerdict::Denied(failure) => {
                        let entry = &mut plan.plan[index];
                        entry.status = StepStatus::Failed;
                        entry.outcome = Some(StepOutcome::Failure(failure));
                        self.step_finished(&plan.plan[index], false, String::new(), 0)
                            .await;
                        continue;
                    }
                    StepVerdict::Waits(pending) => {
                        waiting.push(pending);
                        continue;
                    }
                }
                plan.plan[index].status = StepStatus::InProgress;
                self.turn
                    .events
                    .emit(EventKind::PlanStepStarted {
                        step_id: plan.plan[index].id.clone(),
                        agent: plan.plan[index].agent.clone().unwrap_or_default(),
                        call_id: step_call.id.clone(),
                    })
                    .await;
                running.push(self.run_step(step, index, step_call));
            }
            // The board takes the plan once, at the end: no other plan tool runs meanwhile, and a
            // resumed turn starts from its checkpoint's plan anyway.
            let Some((index, outcome, worker_id, elapsed)) = running.next().await else {
                break;
            };
            if let CallOutcome::Failed { failure } = &outcome {
                if failure.kind == FailureKind::Cancelled {
                    // A worker heard the task's cancel request: the turn stops (4.4).
                    return Err(failure.clone());
                }
            }
            let entry = &mut plan.plan[index];
            let ok = outcome.is_ok();
            entry.worker_id = (!worker_id.is_empty()).then(|| worker_id.clone());
            entry.duration_ms = Some(elapsed);
            match outcome {
                CallOutcome::Ok { output, .. } => {
                    entry.status = StepStatus::Completed;
                    entry.outcome = Some(StepOutcome::Answer(output));
                }
                CallOutcome::Failed { failure } => {
                    entry.status = StepStatus::Failed;
                    entry.outcome = Some(StepOutcome::Failure(failure));
                }
            }
            self.step_finished(&plan.plan[index], ok, worker_id, elapsed)
                .await;
        }
        let output = serde_json::to_string(&plan).unwrap_or_default();
        self.turn
            .events
            .emit(EventKind::PlanUpdated { plan: plan.clone() })
            .await;
        self.board.set(plan);
        if !waiting.is_empty() {
            let suspension = self.ask_for(waiting, answers.as_ref()).await;
            self.board.suspend(suspension);
            return Err(Failure::new(
                FailureKind::Denied,
                "plan steps wait for a person's approval",
            ));
        }
        Ok(output)
    }

    /// The subagent call of a plan step: a `spawn_agent` call whose id is stable for this
    /// `run_plan` call, so a resumed turn asks for the same one.
    fn step_call(&self, run: &ToolCall, entry: &crate::protocol::PlanStep) -> ToolCall {
        ToolCall {
            id: format!("{}-{}", run.id, entry.id),
            name: SPAWN_TOOL.into(),
            arguments: json!({
                "agent": entry.agent.clone().unwrap_or_default(),
                "task": entry.task(),
            }),
        }
    }

    /// Decides a step's subagent call as the policy would decide a `spawn_agent` call.
    async fn step_permission(
        &self,
        step_call: &ToolCall,
        answers: &mut Option<Answers>,
    ) -> StepVerdict {
        let denied = |why: String| StepVerdict::Denied(Failure::new(FailureKind::Denied, why));
        let effects = ToolEffects::default();
        match decide(self.policy, SPAWN_TOOL, effects, &step_call.arguments) {
            Decision::Allow { .. } => StepVerdict::Runs,
            Decision::Deny { reason } => denied(format!("denied by {reason}")),
            Decision::Ask { reason } => {
                let Some(gate) = self.turn.approvals else {
                    return denied(format!(
                        "denied by {reason}; nobody can approve calls of this run"
                    ));
                };
                if answers.is_none() {
                    match gate.answers(&self.turn.origin).await {
                        Ok(found) => *answers = Some(found),
                        Err(failure) => return StepVerdict::Denied(failure),
                    }
                }
                let known = answers.as_ref().cloned().unwrap_or_default();
                if approved_for_session(&known.session_rules, SPAWN_TOOL, &step_call.arguments)
                    .is_some()
                {
                    return StepVerdict::Runs;
                }
                match known.by_call.get(&step_call.id) {
                    Some(answer) if answer.approve => StepVerdict::Runs,
                    Some(answer) => denied(if answer.reason.is_empty() {
                        format!("denied by {}", answer.by)
                    } else {
                        format!("denied by {}: {}", answer.by, answer.reason)
                    }),
                    None if known.expires_at_ms.is_some_and(|at| now_ms() >= at) => denied(
                        format!("denied: nobody answered the approval request in time ({reason})"),
                    ),
                    None => StepVerdict::Waits(PendingCall {
                        call_id: step_call.id.clone(),
                        tool: SPAWN_TOOL.into(),
                        arguments: step_call.arguments.clone(),
                        rule: reason,
                    }),
                }
            }
        }
    }

    /// Announces the steps that wait for a person (once each) and says how long they wait.
    async fn ask_for(&self, waiting: Vec<PendingCall>, answers: Option<&Answers>) -> Awaiting {
        self.asked.store(true, std::sync::atomic::Ordering::Relaxed);
        let now = now_ms();
        let expires_at_ms = answers.and_then(|a| a.expires_at_ms).or_else(|| {
            self.policy
                .approval_timeout()
                .map(|t| now.saturating_add(t.as_millis() as u64))
        });
        for pending in &waiting {
            tracing::info!(call_id = %pending.call_id, rule = %pending.rule, "plan step waits for approval");
            if answers.is_some_and(|a| a.requested.contains(&pending.call_id)) {
                continue;
            }
            self.turn
                .events
                .emit(EventKind::ApprovalRequested {
                    call_id: pending.call_id.clone(),
                    tool: pending.tool.clone(),
                    arguments: pending.arguments.clone(),
                    arguments_ref: None,
                    rule: pending.rule.clone(),
                    expires_at_ms,
                })
                .await;
        }
        Awaiting {
            calls: waiting,
            expires_at_ms,
        }
    }

    async fn step_finished(
        &self,
        entry: &crate::protocol::PlanStep,
        ok: bool,
        worker_id: String,
        duration_ms: u64,
    ) {
        self.turn
            .events
            .emit(EventKind::PlanStepFinished {
                step_id: entry.id.clone(),
                ok,
                worker_id,
                duration_ms,
            })
            .await;
    }

    /// One step's subagent call through the tool service; `(index, outcome, worker, ms)`.
    async fn run_step(
        &self,
        step: u32,
        index: usize,
        step_call: ToolCall,
    ) -> (usize, CallOutcome, String, u64) {
        let started = Instant::now();
        let target = match self.spawn_target(&step_call.arguments) {
            Ok(target) => target,
            Err(failure) => return (index, CallOutcome::Failed { failure }, String::new(), 0),
        };
        let request = ToolCallRequest {
            origin: self.turn.origin.clone(),
            step,
            call: step_call,
            target,
            timeout: self.runtime.settings.subagent_timeout,
            may_have_run: !self.turn.first_run,
        };
        let (outcome, worker) = match self.runtime.tools.clone().oneshot(request).await {
            Ok(result) => (result.outcome, result.worker_id),
            Err(error) => (
                CallOutcome::Failed {
                    failure: failure_from_error(error),
                },
                String::new(),
            ),
        };
        (index, outcome, worker, started.elapsed().as_millis() as u64)
    }
}

enum StepVerdict {
    Runs,
    Denied(Failure),
    Waits(PendingCall),
}
