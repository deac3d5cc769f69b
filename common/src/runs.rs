//! A task's runs as a tree, read from its events: the user's turn on the lead at the root, and
//! under it every subagent run it started (a `spawn_agent` call or a plan step), theirs under
//! them. Each run has its agent, the process that ran it, its status, when it started and ended,
//! and the tokens of its own model calls (the lead's turn reports them in its final result, a
//! subagent's run in its `run_ended` event).
//!
//! Where the links come from: a child's events carry `source = subagent:<call>` (one level down
//! `subagent:<parent call>/<call>`: `protocol::child_event_source`), so each names its parent; the
//! call that started it is announced by its parent's `tool_started` (or `plan_step_started`)
//! event and ends with its `tool_finished` (or `plan_step_finished`). So the tree needs no store
//! of its own: it is the event log of the task, kept as long as `SKEIN_EVENTS` keeps events.

use std::collections::HashMap;

use serde::Serialize;

use crate::protocol::{EventKind, TurnEvent, TurnStatus};

/// The lead's source name in events.
const LEAD: &str = "lead";

/// One run of a task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// `lead`, or `subagent:<call_id>`.
    pub source: String,
    /// The call that started it (none for the lead's turn).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub agent: String,
    /// The lead or worker instance that ran it (the latest, when it ran more than once).
    pub instance: String,
    /// `running`, `completed`, `failed`, `cancelled`, … (a subagent's: `completed` or `failed`
    /// as its call ended, `stopped` when the task's turn ended first).
    pub status: String,
    pub started_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// Tokens of this run's own model calls (its children's are on them); none until it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    pub children: Vec<Run>,
}

/// The tree of a task's runs from its events (in stream order); `None` before it started.
pub fn tree(events: &[TurnEvent]) -> Option<Run> {
    let mut runs: HashMap<String, Run> = HashMap::new();
    // The agent each started call asked for, by the child's source.
    let mut asked: HashMap<String, String> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    for event in events {
        let source = event.source.as_str();
        match &event.event {
            EventKind::TurnStarted {
                agent, instance, ..
            } => {
                let run = runs.entry(source.to_owned()).or_insert_with(|| {
                    order.push(source.to_owned());
                    Run {
                        source: source.to_owned(),
                        call_id: call_of(source).map(str::to_owned),
                        agent: agent.clone(),
                        instance: String::new(),
                        status: "running".into(),
                        started_at_ms: event.at_ms,
                        ended_at_ms: None,
                        tokens: None,
                        children: Vec::new(),
                    }
                });
                run.instance.clone_from(instance);
            }
            EventKind::ToolStarted {
                call_id,
                tool,
                arguments,
                ..
            } if tool == crate::agent::runtime::SPAWN_TOOL => {
                let agent = arguments.get("agent").and_then(|a| a.as_str());
                asked.insert(
                    child_of(source, call_id),
                    agent.unwrap_or_default().to_owned(),
                );
            }
            EventKind::PlanStepStarted { agent, call_id, .. } => {
                asked.insert(child_of(source, call_id), agent.clone());
            }
            EventKind::ToolFinished { call_id, ok, .. } => {
                end_run(&mut runs, &child_of(source, call_id), *ok, event.at_ms);
            }
            EventKind::PlanStepFinished { ok, .. } => {
                // A plan step's child ends with its step (its call id is in the started event).
                if let Some(call_id) = plan_call(events, event) {
                    end_run(&mut runs, &child_of(source, &call_id), *ok, event.at_ms);
                }
            }
            EventKind::RunEnded { usage, .. } => {
                if let Some(run) = runs.get_mut(source) {
                    run.tokens = Some(usage.prompt_tokens.saturating_add(usage.completion_tokens));
                }
            }
            EventKind::Final { result } if source == LEAD => {
                if let Some(run) = runs.get_mut(LEAD) {
                    run.status = status_name(result.status);
                    run.ended_at_ms = Some(event.at_ms);
                    run.tokens = Some(
                        result
                            .usage
                            .prompt_tokens
                            .saturating_add(result.usage.completion_tokens),
                    );
                }
            }
            _ => {}
        }
    }
    // A child still running when the task's turn ended stopped with it (cancelled, timed out).
    let root_ended = runs.get(LEAD).and_then(|r| r.ended_at_ms);
    if let Some(ended) = root_ended {
        for run in runs.values_mut() {
            if run.source != LEAD && run.ended_at_ms.is_none() {
                run.status = "stopped".into();
                run.ended_at_ms = Some(ended);
            }
        }
    }
    // Children under their parents, deepest first.
    for source in order.iter().rev() {
        let Some(parent) = parent_of(source) else {
            continue;
        };
        let Some(mut child) = runs.remove(source) else {
            continue;
        };
        if child.agent.is_empty() {
            child.agent = asked.get(source).cloned().unwrap_or_default();
        }
        match runs.get_mut(&parent) {
            Some(parent) => parent.children.insert(0, child),
            // Its parent's events are gone (older than the stream keeps): it stands alone.
            None => {
                runs.insert(source.clone(), child);
            }
        }
    }
    runs.remove(LEAD)
}

/// The source of the run a call of run `source` started.
fn child_of(source: &str, call_id: &str) -> String {
    match source.strip_prefix("subagent:") {
        Some(lineage) => format!("subagent:{lineage}/{call_id}"),
        None => format!("subagent:{call_id}"),
    }
}

/// The source of the run that started run `source` (`lead` for a first-level child).
fn parent_of(source: &str) -> Option<String> {
    let lineage = source.strip_prefix("subagent:")?;
    Some(match lineage.rsplit_once('/') {
        Some((parent, _)) => format!("subagent:{parent}"),
        None => LEAD.to_owned(),
    })
}

/// The call that started run `source`.
fn call_of(source: &str) -> Option<&str> {
    let lineage = source.strip_prefix("subagent:")?;
    Some(lineage.rsplit_once('/').map_or(lineage, |(_, call)| call))
}

/// The call id of the plan step a `plan_step_finished` event ends (from its started event).
fn plan_call(events: &[TurnEvent], finished: &TurnEvent) -> Option<String> {
    let EventKind::PlanStepFinished { step_id, .. } = &finished.event else {
        return None;
    };
    events.iter().rev().find_map(|e| match &e.event {
        EventKind::PlanStepStarted {
            step_id: id,
            call_id,
            ..
        } if id == step_id && e.source == finished.source && e.seq < finished.seq => {
            Some(call_id.clone())
        }
        _ => None,
    })
}

fn end_run(runs: &mut HashMap<String, Run>, source: &str, ok: bool, at_ms: u64) {
    if let Some(run) = runs.get_mut(source) {
        run.status = if ok { "completed" } else { "failed" }.into();
        run.ended_at_ms = Some(at_ms);
    }
}

fn status_name(status: TurnStatus) -> String {
    status.as_str().to_owned()
}

/// The tree as indented lines: `agent on instance · status · 1.2 s · N tokens (call id)`.
pub fn render(run: &Run) -> String {
    let mut out = String::new();
    line(run, "", "", &mut out);
    out
}

fn line(run: &Run, first: &str, rest: &str, out: &mut String) {
    let took = run
        .ended_at_ms
        .map(|end| {
            format!(
                " · {:.1} s",
                end.saturating_sub(run.started_at_ms) as f64 / 1000.0
            )
        })
        .unwrap_or_default();
    let tokens = run
        .tokens
        .map(|t| format!(" · {t} tokens"))
        .unwrap_or_default();
    let call = run
        .call_id
        .as_ref()
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    out.push_str(&format!(
        "{first}{} on {} · {}{took}{tokens}{call}\n",
        run.agent, run.instance, run.status
    ));
    for (i, child) in run.children.iter().enumerate() {
        let last = i + 1 == run.children.len();
        let (branch, carry) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        line(
            child,
            &format!("{rest}{branch}"),
            &format!("{rest}{carry}"),
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::FinalResult;

    fn event(source: &str, seq: u64, at_ms: u64, event: EventKind) -> TurnEvent {
        TurnEvent {
            v: 1,
            task_id: "t1".into(),
            source: source.into(),
            seq,
            at_ms,
            event,
        }
    }

    fn started(agent: &str, instance: &str) -> EventKind {
        EventKind::TurnStarted {
            agent: agent.into(),
            session: "s".into(),
            instance: instance.into(),
            resumed_at_step: None,
            trace_id: None,
        }
    }

    fn spawn(call_id: &str, agent: &str) -> EventKind {
        EventKind::ToolStarted {
            call_id: call_id.into(),
            tool: "spawn_agent".into(),
            arguments: json!({"agent": agent, "task": "go"}),
            arguments_ref: None,
            permission: None,
            rule: String::new(),
        }
    }

    fn finished(call_id: &str, ok: bool) -> EventKind {
        EventKind::ToolFinished {
            call_id: call_id.into(),
            tool: "spawn_agent".into(),
            ok,
            worker_id: "w".into(),
            preview: String::new(),
            duration_ms: 3,
            attempts: 1,
        }
    }

    #[test]
    fn children_hang_under_the_run_that_started_them() {
        let final_result = FinalResult {
            v: 1,
            task_id: "t1".into(),
            tenant: "a".into(),
            session: "s".into(),
            status: TurnStatus::Completed,
            answer: Some("done".into()),
            answer_ref: None,
            output: None,
            output_ref: false,
            failure: None,
            iterations: 2,
            limit_reached: false,
            usage: crate::protocol::message::Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                ..Default::default()
            },
            trace_id: None,
            spent: None,
        };
        let events = vec![
            event("lead", 1, 1000, started("assistant", "lead-1")),
            event("lead", 2, 1100, spawn("c1", "planner")),
            event("subagent:c1", 1, 1200, started("planner", "w1")),
            event("subagent:c1", 2, 1300, spawn("c2", "researcher")),
            event("subagent:c1/c2", 1, 1400, started("researcher", "w2")),
            event(
                "subagent:c1/c2",
                2,
                1850,
                EventKind::RunEnded {
                    status: TurnStatus::Completed,
                    usage: crate::protocol::message::Usage {
                        prompt_tokens: 7,
                        completion_tokens: 3,
                        ..Default::default()
                    },
                },
            ),
            event("subagent:c1", 3, 1900, finished("c2", true)),
            event("lead", 3, 2000, finished("c1", false)),
            event(
                "lead",
                4,
                2100,
                EventKind::PlanStepStarted {
                    step_id: "a".into(),
                    agent: "researcher".into(),
                    call_id: "c3-a".into(),
                },
            ),
            event("subagent:c3-a", 1, 2200, started("researcher", "w1")),
            event(
                "lead",
                5,
                2600,
                EventKind::PlanStepFinished {
                    step_id: "a".into(),
                    ok: true,
                    worker_id: "w1".into(),
                    duration_ms: 500,
                },
            ),
            event(
                "lead",
                6,
                3000,
                EventKind::Final {
                    result: final_result,
                },
            ),
        ];
        let root = tree(&events).expect("the lead's run");
        assert_eq!(
            (root.agent.as_str(), root.status.as_str()),
            ("assistant", "completed")
        );
        assert_eq!(root.tokens, Some(15));
        assert_eq!(root.children.len(), 2);
        let planner = &root.children[0];
        assert_eq!(
            (
                planner.agent.as_str(),
                planner.instance.as_str(),
                planner.status.as_str()
            ),
            ("planner", "w1", "failed")
        );
        assert_eq!(planner.children.len(), 1);
        assert_eq!(planner.children[0].agent, "researcher");
        assert_eq!(planner.children[0].status, "completed");
        assert_eq!(planner.children[0].tokens, Some(10), "its own run_ended");
        assert_eq!(planner.tokens, None, "it reported none");
        let step = &root.children[1];
        assert_eq!(
            (step.call_id.as_deref(), step.status.as_str()),
            (Some("c3-a"), "completed")
        );
        let text = render(&root);
        assert!(
            text.starts_with("assistant on lead-1 · completed · 2.0 s · 15 tokens\n"),
            "{text}"
        );
        assert!(
            text.contains("├─ planner on w1 · failed · 0.8 s (c1)\n"),
            "{text}"
        );
        assert!(
            text.contains("│  └─ researcher on w2 · completed · 0.5 s · 10 tokens (c2)\n"),
            "{text}"
        );
        assert!(
            text.contains("└─ researcher on w1 · completed · 0.4 s (c3-a)\n"),
            "{text}"
        );
        assert_eq!(tree(&[]), None);
    }
}
