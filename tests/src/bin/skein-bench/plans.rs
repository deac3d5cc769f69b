//! Plans across workers: a turn whose plan has `steps` independent steps, each a subagent that
//! waits `STEP_MS` in a tool, run by `run_plan` on two workers — its makespan against the sum of
//! its steps' durations (the parallel speed-up); and the whole turn of a plan of `steps` no-op
//! steps against the whole turn of as many plain `spawn_agent` calls made at once (the plan's
//! overhead per step).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skein_common::client::SkeinClient;
use skein_common::config::NatsConfig;
use skein_common::protocol::{EventKind, TurnStatus};

use crate::nodes::{wait_workers, Nodes};
use crate::report::{latencies, Report};
use crate::turns::task;
use crate::Failed;

/// How long each step of the speed-up plan waits in its tool.
const STEP_MS: u64 = 200;
/// Turns measured for the overhead figures.
const OVERHEAD_SAMPLES: usize = 20;

/// Writes the agents folder and the scenario of the plan bench into `dir`.
fn write_agents(dir: &Path, steps: usize) -> Result<(), Failed> {
    let agents = dir.join("plan-agents");
    std::fs::create_dir_all(agents.join("subagents"))?;
    let cap = steps.clamp(1, 64);
    std::fs::write(
        agents.join("AGENTS.md"),
        format!(
            "+++\nname = \"planner\"\nplanning = true\nmax_parallel_steps = {cap}\n\
             subagents = [\"sleeper\", \"quick\"]\n+++\nPlan.\n"
        ),
    )?;
    std::fs::write(
        agents.join("subagents/spawner.md"),
        "+++\nname = \"spawner\"\nsubagents = [\"quick\"]\n+++\nSpawn.\n",
    )?;
    std::fs::write(
        agents.join("subagents/sleeper.md"),
        "+++\nname = \"sleeper\"\ndescription = \"waits\"\n+++\nWait.\n",
    )?;
    std::fs::write(
        agents.join("subagents/quick.md"),
        "+++\nname = \"quick\"\ndescription = \"answers at once\"\n+++\nAnswer.\n",
    )?;
    // Each plan's own step ids: a revision may not rewrite steps a worker finished.
    let plan = |agent: &str| -> Value {
        let steps: Vec<Value> = (1..=steps)
            .map(|i| json!({ "id": format!("{agent}-{i}"), "step": format!("step {i}"), "status": "pending", "agent": agent, "input": format!("step-{i}") }))
            .collect();
        json!({ "tool_calls": [
            { "name": "update_plan", "arguments": { "plan": steps } },
            { "name": "run_plan", "arguments": {} }
        ] })
    };
    let spawns: Vec<Value> = (1..=steps)
        .map(|i| json!({ "name": "spawn_agent", "arguments": { "agent": "quick", "task": format!("step-{i}") } }))
        .collect();
    let turn = |first: Value| json!({ "turns": [ { "steps": [ first, { "answer": "done" } ] } ] });
    let scenario = json!({ "agents": {
        // Turn 1 of a session plans sleeping steps; later turns plan quick ones.
        "planner": { "turns": [
            { "steps": [ plan("sleeper"), { "answer": "done" } ] },
            { "steps": [ plan("quick"), { "answer": "done" } ] }
        ] },
        "spawner": turn(json!({ "tool_calls": spawns })),
        "sleeper": { "turns": [ { "steps": [
            { "tool_calls": [ { "name": "slow_effect", "arguments": { "key": "{{input}}", "ms": STEP_MS } } ] },
            { "answer": "slept" }
        ] } ] },
        "quick": { "turns": [ { "steps": [ { "answer": "quick" } ] } ] }
    } });
    std::fs::write(dir.join("plan-scenario.json"), scenario.to_string())?;
    Ok(())
}

pub(crate) async fn plans(
    cluster: &Nodes,
    store: &skein_common::store::SessionStore,
    steps: usize,
    report: &mut Report,
) -> Result<(), Failed> {
    write_agents(&cluster.dir, steps)?;
    let scenario = cluster.dir.join("plan-scenario.json");
    let agents = cluster.dir.join("plan-agents");
    let mut workers = [
        cluster.subagent_worker("plan-worker-1", &scenario),
        cluster.subagent_worker("plan-worker-2", &scenario),
    ];
    wait_workers(store, 2).await?;
    let mut lead = cluster.planning_lead(&scenario, &agents);
    let client = SkeinClient::connect(&NatsConfig::local(cluster.nats.clone())).await?;

    // The speed-up: one plan of sleeping steps.
    let mut submission = task(0);
    submission.agent = "planner".into();
    let started = Instant::now();
    let mut step_ms = 0u64;
    let result = client
        .run(&submission, Duration::from_secs(120), |event| {
            if let EventKind::PlanStepFinished { duration_ms, .. } = event.event {
                step_ms += duration_ms;
            }
        })
        .await?;
    let makespan = started.elapsed();
    if result.status != TurnStatus::Completed {
        return Err(format!("the plan turn did not complete: {result:?}").into());
    }
    report.add(
        &format!("plan: {steps} steps of {STEP_MS} ms on 2 workers, makespan"),
        makespan.as_secs_f64() * 1e3,
        "ms",
    );
    report.add(
        "plan: speed-up (sum of step durations / makespan)",
        step_ms as f64 / makespan.as_secs_f64() / 1e3,
        "x",
    );

    // The overhead: a plan of quick steps (turn 2 of its session) against as many spawn_agent
    // calls at once.
    let mut planned = Vec::with_capacity(OVERHEAD_SAMPLES);
    let mut spawned = Vec::with_capacity(OVERHEAD_SAMPLES);
    for i in 0..=OVERHEAD_SAMPLES {
        let mut first = task(i);
        first.agent = "planner".into();
        let mut second = task(i);
        second.agent = "planner".into();
        second.session.clone_from(&first.session);
        // Turn 1 (sleeping steps) is not measured; turn 2 plans quick steps.
        client.run(&first, Duration::from_secs(120), |_| {}).await?;
        let at = Instant::now();
        let mut ran = 0;
        let planned_turn = client
            .run(&second, Duration::from_secs(120), |event| {
                if matches!(event.event, EventKind::PlanStepFinished { ok: true, .. }) {
                    ran += 1;
                }
            })
            .await?;
        let planned_time = at.elapsed();
        if ran != steps {
            return Err(format!("the quick plan ran {ran} of its {steps} steps").into());
        }
        let mut spawn = task(i);
        spawn.agent = "spawner".into();
        let at = Instant::now();
        let spawned_turn = client.run(&spawn, Duration::from_secs(120), |_| {}).await?;
        let spawned_time = at.elapsed();
        for turn in [&planned_turn, &spawned_turn] {
            if turn.status != TurnStatus::Completed {
                return Err(format!("an overhead turn did not complete: {turn:?}").into());
            }
        }
        if i > 0 {
            planned.push(planned_time);
            spawned.push(spawned_time);
        }
    }
    latencies(
        report,
        &format!("plan: turn running {steps} quick steps"),
        planned,
    );
    latencies(
        report,
        &format!("plan: turn of {steps} spawn_agent calls at once"),
        spawned,
    );
    lead.kill();
    for worker in &mut workers {
        worker.kill();
    }
    Ok(())
}
