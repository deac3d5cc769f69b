//! Plans the model keeps: `update_plan`'s arguments checked and merged into the session's plan,
//! the steps ready to run, and the plan rendered for the model and for people.
//!
//! Invariants of every plan this module returns: at most [`MAX_STEPS`] steps; ids unique plain
//! tokens (letters, digits, `_`, `-`; at most 32 characters); every `after` names another step;
//! no cycle; a step naming an `agent` names one of the turn's subagents. A revision never changes
//! a step a worker finished (a step it keeps under that id keeps its text, agent, input,
//! dependencies, status and outcome; it may drop the step, for a new plan), and it keeps a step's
//! outcome only while the step is unchanged.
//!
//! Pure functions: the runtime (`agent::runtime::planning`) runs the steps and records their
//! outcomes.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde_json::Value;

use crate::protocol::{Plan, PlanStep, StepStatus};

/// Most steps a plan may have.
pub const MAX_STEPS: usize = 64;
/// Longest step text, and longest input of a step, in bytes.
pub const MAX_STEP_TEXT: usize = 16 * 1024;
/// Longest explanation, in bytes.
pub const MAX_EXPLANATION: usize = 4 * 1024;
/// Longest step id.
pub const MAX_ID_LEN: usize = 32;
/// Most steps `run_plan` runs at once when the agent sets no `max_parallel_steps`.
pub const DEFAULT_MAX_PARALLEL: u32 = 8;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateArguments {
    #[serde(default)]
    explanation: Option<String>,
    plan: Vec<StepArguments>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepArguments {
    #[serde(default)]
    id: Option<String>,
    step: String,
    #[serde(default)]
    status: Option<StepStatus>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    after: Vec<String>,
}

/// The plan `update_plan`'s `arguments` make of the `current` one, or why it is refused (a
/// sentence the model reads). `subagents` are the agents a step may name.
pub fn revise(
    current: Option<&Plan>,
    arguments: &Value,
    subagents: &[&str],
) -> Result<Plan, String> {
    let update: UpdateArguments = serde_json::from_value(arguments.clone()).map_err(|e| {
        format!(
            "{e}; expected {{\"explanation\"?: string, \"plan\": [{{\"step\": string, \"status\": \
             \"pending\"|\"in_progress\"|\"completed\"|\"cancelled\", \"id\"?: string, \
             \"agent\"?: string, \"input\"?: string, \"after\"?: [string]}}]}}"
        )
    })?;
    let explanation = update.explanation.unwrap_or_default();
    if explanation.len() > MAX_EXPLANATION {
        return Err(format!(
            "the explanation is longer than {MAX_EXPLANATION} bytes"
        ));
    }
    if update.plan.len() > MAX_STEPS {
        return Err(format!(
            "the plan has {} steps; at most {MAX_STEPS} are allowed",
            update.plan.len()
        ));
    }
    let mut steps = Vec::with_capacity(update.plan.len());
    for (i, given) in update.plan.into_iter().enumerate() {
        let id = given.id.unwrap_or_else(|| (i + 1).to_string());
        check_id(&id)?;
        if given.step.trim().is_empty() {
            return Err(format!("step {id:?} has no text"));
        }
        if given.step.len() > MAX_STEP_TEXT
            || given
                .input
                .as_ref()
                .is_some_and(|s| s.len() > MAX_STEP_TEXT)
        {
            return Err(format!(
                "step {id:?} is longer than {MAX_STEP_TEXT} bytes; put long material in a file"
            ));
        }
        if let Some(agent) = &given.agent {
            if !subagents.contains(&agent.as_str()) {
                return Err(if subagents.is_empty() {
                    format!("step {id:?} names agent {agent:?}, but no subagent can run steps here")
                } else {
                    format!(
                        "step {id:?} names unknown agent {agent:?}; available: {}",
                        subagents.join(", ")
                    )
                });
            }
        }
        steps.push(PlanStep {
            id,
            step: given.step,
            status: given.status.unwrap_or(StepStatus::Pending),
            agent: given.agent,
            input: given.input.filter(|s| !s.trim().is_empty()),
            after: given.after,
            outcome: None,
            worker_id: None,
            duration_ms: None,
        });
    }
    check_graph(&steps)?;
    if let Some(current) = current {
        keep_finished_work(current, &mut steps)?;
    }
    Ok(Plan {
        explanation,
        plan: steps,
    })
}

fn check_id(id: &str) -> Result<(), String> {
    let plain = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        Ok(())
    } else {
        Err(format!(
            "step id {id:?} is not a plain id (1 to {MAX_ID_LEN} letters, digits, _ or -)"
        ))
    }
}

/// Unique ids, dependencies on existing other steps, no cycle.
fn check_graph(steps: &[PlanStep]) -> Result<(), String> {
    let mut index = HashMap::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        if index.insert(step.id.as_str(), i).is_some() {
            return Err(format!("step id {:?} is used twice", step.id));
        }
    }
    for step in steps {
        for dep in &step.after {
            if dep == &step.id {
                return Err(format!("step {:?} waits for itself", step.id));
            }
            if !index.contains_key(dep.as_str()) {
                return Err(format!(
                    "step {:?} waits for step {dep:?}, which is not in the plan",
                    step.id
                ));
            }
        }
    }
    // Kahn's algorithm: whatever cannot be ordered lies on a cycle.
    let mut waiting: Vec<usize> = steps.iter().map(|s| s.after.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        for dep in &step.after {
            dependents[index[dep.as_str()]].push(i);
        }
    }
    let mut ready: Vec<usize> = (0..steps.len()).filter(|&i| waiting[i] == 0).collect();
    let mut ordered = 0;
    while let Some(i) = ready.pop() {
        ordered += 1;
        for &next in &dependents[i] {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                ready.push(next);
            }
        }
    }
    if ordered < steps.len() {
        let on_cycle: Vec<&str> = steps
            .iter()
            .zip(&waiting)
            .filter(|(_, w)| **w > 0)
            .map(|(s, _)| s.id.as_str())
            .collect();
        return Err(format!(
            "the steps' dependencies form a cycle (among steps {})",
            on_cycle.join(", ")
        ));
    }
    Ok(())
}

/// Refuses a revision that changes a step a worker finished; carries outcomes over to the steps
/// that stay as they were.
fn keep_finished_work(current: &Plan, steps: &mut [PlanStep]) -> Result<(), String> {
    for old in &current.plan {
        // A finished step may leave the plan (a new plan for new work), but not change.
        let kept = steps.iter().find(|s| s.id == old.id);
        if let (true, Some(new)) = (old.done_by_worker(), kept) {
            if !same_work(old, new) || new.status != StepStatus::Completed {
                return Err(format!(
                    "step {:?} was completed by a worker and cannot be changed; keep it as it \
                     is (add a new step to redo its work)",
                    old.id
                ));
            }
        }
        if let Some(new) = steps.iter_mut().find(|s| s.id == old.id) {
            if old.outcome.is_some() && same_work(old, new) && new.status == old.status {
                new.outcome.clone_from(&old.outcome);
                new.worker_id.clone_from(&old.worker_id);
                new.duration_ms = old.duration_ms;
            }
        }
    }
    Ok(())
}

fn same_work(a: &PlanStep, b: &PlanStep) -> bool {
    a.step == b.step && a.agent == b.agent && a.task() == b.task() && a.after == b.after
}

/// Whether `run_plan` would run this step: it names an agent and has not run to an outcome.
pub fn runnable(step: &PlanStep) -> bool {
    step.agent.is_some() && matches!(step.status, StepStatus::Pending | StepStatus::InProgress)
}

/// Indexes of the steps that can start now: runnable, not in `started`, and every step they
/// wait for completed. In the plan's order.
pub fn ready(plan: &Plan, started: &HashSet<usize>) -> Vec<usize> {
    let completed: HashSet<&str> = plan
        .plan
        .iter()
        .filter(|s| s.status == StepStatus::Completed)
        .map(|s| s.id.as_str())
        .collect();
    plan.plan
        .iter()
        .enumerate()
        .filter(|(i, step)| {
            runnable(step)
                && !started.contains(i)
                && step.after.iter().all(|d| completed.contains(d.as_str()))
        })
        .map(|(i, _)| i)
        .collect()
}

/// The plan as a checklist, a line per step: `[x] 2 Collect figures (researcher on w1, 1.2 s)`.
pub fn checklist(plan: &Plan) -> String {
    let mut text = String::new();
    if !plan.explanation.is_empty() {
        text.push_str(&plan.explanation);
        text.push('\n');
    }
    for step in &plan.plan {
        let mark = match step.status {
            StepStatus::Pending => "[ ]",
            StepStatus::InProgress => "[~]",
            StepStatus::Completed => "[x]",
            StepStatus::Cancelled => "[-]",
            StepStatus::Failed => "[!]",
        };
        text.push_str(&format!("{mark} {} {}", step.id, first_line(&step.step)));
        let mut notes = Vec::new();
        if let Some(agent) = &step.agent {
            notes.push(match &step.worker_id {
                Some(worker) => format!("{agent} on {worker}"),
                None => agent.clone(),
            });
        }
        if let Some(ms) = step.duration_ms {
            notes.push(format!("{:.1} s", ms as f64 / 1000.0));
        }
        if !step.after.is_empty() {
            notes.push(format!("after {}", step.after.join(", ")));
        }
        if let Some(crate::protocol::StepOutcome::Failure(failure)) = &step.outcome {
            notes.push(format!(
                "{}: {}",
                failure.kind.as_str(),
                first_line(&failure.message)
            ));
        }
        if !notes.is_empty() {
            text.push_str(&format!(" ({})", notes.join("; ")));
        }
        text.push('\n');
    }
    text
}

fn first_line(text: &str) -> String {
    crate::text::cut(text.lines().next().unwrap_or(""), 120)
}

#[cfg(test)]
mod tests;
