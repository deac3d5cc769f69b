use serde_json::json;

use super::*;
use crate::protocol::{Failure, FailureKind, StepOutcome};

const AGENTS: &[&str] = &["researcher", "writer"];

fn plan(arguments: Value) -> Result<Plan, String> {
    revise(None, &arguments, AGENTS)
}

#[test]
fn ids_default_to_positions_and_statuses_to_pending() {
    let plan = plan(json!({"explanation": "why", "plan": [
        {"step": "look", "status": "completed"},
        {"step": "think"},
        {"step": "ask", "agent": "researcher", "input": "find X", "after": ["1"]}
    ]}))
    .expect("valid");
    let ids: Vec<_> = plan.plan.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["1", "2", "3"]);
    assert_eq!(plan.plan[0].status, StepStatus::Completed);
    assert_eq!(plan.plan[1].status, StepStatus::Pending);
    assert_eq!(plan.plan[2].task(), "find X");
    assert_eq!(plan.plan[1].task(), "think");
    assert_eq!(plan.explanation, "why");
}

#[test]
fn bad_plans_are_refused_with_the_reason() {
    let cases = [
        (
            json!({"plan": [{"step": "a", "id": "x"}, {"step": "b", "id": "x"}]}),
            "used twice",
        ),
        (
            json!({"plan": [{"step": "a", "after": ["9"]}]}),
            "not in the plan",
        ),
        (
            json!({"plan": [{"step": "a", "after": ["1"]}]}),
            "waits for itself",
        ),
        (
            json!({"plan": [{"step": "a", "after": ["2"]}, {"step": "b", "after": ["3"]}, {"step": "c", "after": ["1"]}]}),
            "cycle",
        ),
        (
            json!({"plan": [{"step": "a", "agent": "nobody"}]}),
            "unknown agent",
        ),
        (json!({"plan": [{"step": " "}]}), "no text"),
        (
            json!({"plan": [{"step": "a", "id": "a.b"}]}),
            "not a plain id",
        ),
        (
            json!({"plan": [{"step": "a", "status": "done"}]}),
            "expected",
        ),
        (json!({"steps": []}), "expected"),
        (
            json!({"plan": [{"step": "a", "colour": "red"}]}),
            "unknown field",
        ),
    ];
    for (arguments, why) in cases {
        let err = plan(arguments.clone()).expect_err("refused");
        assert!(err.contains(why), "{arguments}: {err}");
    }
    let many: Vec<Value> = (0..=MAX_STEPS)
        .map(|i| json!({"step": format!("s{i}")}))
        .collect();
    assert!(plan(json!({ "plan": many }))
        .expect_err("too many")
        .contains("at most"));
    let no_agents = revise(
        None,
        &json!({"plan": [{"step": "a", "agent": "researcher"}]}),
        &[],
    );
    assert!(no_agents.expect_err("no subagents").contains("no subagent"));
}

fn finished(mut plan: Plan, index: usize, ok: bool) -> Plan {
    let step = &mut plan.plan[index];
    step.worker_id = Some("w1".into());
    step.duration_ms = Some(5);
    if ok {
        step.status = StepStatus::Completed;
        step.outcome = Some(StepOutcome::Answer("done".into()));
    } else {
        step.status = StepStatus::Failed;
        step.outcome = Some(StepOutcome::Failure(Failure::new(
            FailureKind::TimedOut,
            "slow",
        )));
    }
    plan
}

#[test]
fn a_step_a_worker_finished_cannot_be_changed_but_may_leave_the_plan() {
    let first = json!({"plan": [
        {"step": "a", "agent": "researcher"},
        {"step": "b", "agent": "writer", "after": ["1"]}
    ]});
    let current = finished(plan(first).expect("valid"), 0, true);
    for change in [
        json!({"plan": [{"step": "a, again", "agent": "researcher", "status": "completed"}, {"step": "b", "agent": "writer", "after": ["1"]}]}),
        json!({"plan": [{"step": "a", "agent": "researcher", "status": "pending"}, {"step": "b", "agent": "writer", "after": ["1"]}]}),
    ] {
        let err = revise(Some(&current), &change, AGENTS).expect_err("refused");
        assert!(err.contains("completed by a worker"), "{change}: {err}");
    }
    let fresh = revise(
        Some(&current),
        &json!({"plan": [{"step": "next", "id": "n1"}]}),
        AGENTS,
    )
    .expect("a new plan may drop finished steps");
    assert_eq!(fresh.plan.len(), 1);
    // Kept as it was, with a new step: its outcome stays.
    let kept = revise(
        Some(&current),
        &json!({"plan": [
            {"step": "a", "agent": "researcher", "status": "completed"},
            {"step": "b", "agent": "writer", "after": ["1"]},
            {"step": "c"}
        ]}),
        AGENTS,
    )
    .expect("allowed");
    assert_eq!(kept.plan[0].outcome, current.plan[0].outcome);
    assert_eq!(kept.plan[0].worker_id.as_deref(), Some("w1"));
    assert_eq!(kept.plan.len(), 3);
}

#[test]
fn a_failed_step_may_be_retried_or_changed_and_loses_its_outcome() {
    let first = json!({"plan": [{"step": "a", "agent": "researcher"}]});
    let current = finished(plan(first).expect("valid"), 0, false);
    let same = revise(
        Some(&current),
        &json!({"plan": [{"step": "a", "agent": "researcher", "status": "failed"}]}),
        AGENTS,
    )
    .expect("allowed");
    assert!(
        same.plan[0].outcome.is_some(),
        "unchanged: the failure stays"
    );
    let retried = revise(
        Some(&current),
        &json!({"plan": [{"step": "a", "agent": "researcher"}]}),
        AGENTS,
    )
    .expect("allowed");
    assert_eq!(retried.plan[0].status, StepStatus::Pending);
    assert_eq!(retried.plan[0].outcome, None);
    assert!(runnable(&retried.plan[0]));
}

#[test]
fn ready_steps_wait_for_every_step_they_name() {
    let p = plan(json!({"plan": [
        {"step": "a", "agent": "researcher"},
        {"step": "b", "agent": "researcher"},
        {"step": "c", "agent": "writer", "after": ["1", "2"]},
        {"step": "own checklist item"}
    ]}))
    .expect("valid");
    let none = HashSet::new();
    assert_eq!(ready(&p, &none), vec![0, 1]);
    let p = finished(p, 0, true);
    assert_eq!(ready(&p, &HashSet::from([1])), Vec::<usize>::new());
    let p = finished(p, 1, false);
    assert_eq!(
        ready(&p, &none),
        Vec::<usize>::new(),
        "a failed step holds its dependents"
    );
    let mut p = p;
    p.plan[1].status = StepStatus::Completed;
    assert_eq!(ready(&p, &none), vec![2]);
}

#[test]
fn the_checklist_shows_each_step_and_its_worker() {
    let p = plan(json!({"explanation": "Two at once, then one.", "plan": [
        {"step": "a", "agent": "researcher"},
        {"step": "b", "after": ["1"]}
    ]}))
    .expect("valid");
    let p = finished(p, 0, true);
    let text = checklist(&p);
    assert_eq!(
        text,
        "Two at once, then one.\n[x] 1 a (researcher on w1; 0.0 s)\n[ ] 2 b (after 1)\n"
    );
}
