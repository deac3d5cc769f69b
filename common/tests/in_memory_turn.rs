//! The runtime below its transport: whole turns run entirely in memory (no NATS, no Redis) through
//! the in-memory seams — parallel calls, a subagent, a resume from a checkpoint, and an approval
//! that suspends the turn and resumes it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::FutureExt;
use serde_json::{json, Value};
use skein_common::agent::memory::{
    FixedDirectory, InMemoryTools, MemoryApprovals, MemoryCheckpoints, MemoryEvents, ToolFn,
};
use skein_common::agent::middleware::Middleware;
use skein_common::agent::model::scripted::ScriptedModel;
use skein_common::agent::runtime::{Runtime, RuntimeSettings, TurnInput, TurnOutput, TurnStop};
use skein_common::agent::seams::{ProviderService, TurnCheckpoint};
use skein_common::agent::skills::SkillCatalog;
use skein_common::protocol::{
    AgentSpec, ApprovalAnswer, EventKind, PermissionPolicy, TaskOrigin, ToolEffects, ToolSpec,
    TurnStatus, Verdict,
};
use tokio_util::sync::CancellationToken;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

const SCENARIO: &str = r#"{
  "agents": {
    "lead": { "turns": [ { "steps": [
      { "tool_calls": [
          { "name": "echo", "arguments": { "text": "a" } },
          { "name": "echo", "arguments": { "text": "b" } } ] },
      { "tool_calls": [
          { "name": "spawn_agent", "arguments": { "agent": "helper", "task": "say c" } },
          { "name": "echo", "arguments": { "text": "d" } } ] },
      { "answer": "done: {{observations}}" }
    ] } ] },
    "helper": { "turns": [ { "steps": [
      { "tool_calls": [ { "name": "echo", "arguments": { "text": "c" } } ] },
      { "answer": "helper saw {{observations}}" }
    ] } ] },
    "guarded": { "turns": [ { "steps": [
      { "tool_calls": [ { "name": "delete", "arguments": { "path": "old.txt" } } ] },
      { "answer": "after approval: {{observations}}" }
    ] } ] }
  }
}"#;

fn spec(name: &str, effects: ToolEffects) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("{name} tool"),
        parameters: json!({"type": "object"}),
        concurrency_safe: true,
        effects,
    }
}

fn agent(name: &str, subagents: Vec<AgentSpec>, permissions: PermissionPolicy) -> AgentSpec {
    AgentSpec {
        name: name.into(),
        description: format!("the {name}"),
        system_prompt: format!("You are {name}."),
        model: String::new(),
        tools: vec!["*".into()],
        subagents,
        max_iterations: 8,
        permissions,
        skills: None,
        context_tokens: None,
        fallback_models: Vec::new(),
        planning: false,
        max_parallel_steps: None,
        max_concurrency: None,
        budget: None,
        output_schema: None,
    }
}

struct Fixture {
    runtime: Arc<Runtime>,
    tools: InMemoryTools,
    /// How many times each tool function body ran.
    echoes: Arc<AtomicUsize>,
    deletes: Arc<AtomicUsize>,
}

fn fixture() -> Fixture {
    let echoes = Arc::new(AtomicUsize::new(0));
    let deletes = Arc::new(AtomicUsize::new(0));
    let echo: ToolFn = {
        let echoes = echoes.clone();
        Arc::new(move |args: Value| {
            echoes.fetch_add(1, Ordering::SeqCst);
            let text = args["text"].as_str().unwrap_or_default().to_owned();
            async move { Ok(format!("echo {text}")) }.boxed()
        })
    };
    let delete: ToolFn = {
        let deletes = deletes.clone();
        Arc::new(move |args: Value| {
            deletes.fetch_add(1, Ordering::SeqCst);
            let path = args["path"].as_str().unwrap_or_default().to_owned();
            async move { Ok(format!("deleted {path}")) }.boxed()
        })
    };
    let destructive = ToolEffects {
        destructive: true,
        ..ToolEffects::default()
    };
    let tools = InMemoryTools::new([
        (spec("echo", ToolEffects::default()), echo),
        (spec("delete", destructive), delete),
    ]);
    let runtime = runtime_over(&tools, SCENARIO, SkillCatalog::default(), Middleware::new());
    Fixture {
        runtime,
        tools,
        echoes,
        deletes,
    }
}

/// A runtime over `tools` and a scripted model playing `scenario`, its subagents run on itself.
fn runtime_over(
    tools: &InMemoryTools,
    scenario: &str,
    skills: SkillCatalog,
    middleware: Middleware,
) -> Arc<Runtime> {
    let model = ScriptedModel::from_json(scenario).expect("valid scenario");
    let runtime = Arc::new(Runtime::new(
        BoxCloneSyncService::new(ProviderService::new(model).map_err(Into::into)),
        BoxCloneSyncService::new(tools.clone().map_err(Into::into)),
        Arc::new(FixedDirectory(Arc::new(tools.catalog()))),
        skills,
        middleware,
        RuntimeSettings {
            provider: "scripted".into(),
            ..RuntimeSettings::default()
        },
    ));
    tools.run_subagents_on(&runtime);
    runtime
}

fn origin(task: &str) -> TaskOrigin {
    TaskOrigin {
        task_id: task.into(),
        tenant: "acme".into(),
        user: "u".into(),
        session: "s1".into(),
        workspace: "s1".into(),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    }
}

struct Run<'a> {
    agent: &'a AgentSpec,
    task: &'a str,
    resume: Option<TurnCheckpoint>,
    checkpoints: &'a MemoryCheckpoints,
    approvals: Option<&'a MemoryApprovals>,
}

async fn run(fx: &Fixture, run: Run<'_>) -> (Result<TurnOutput, TurnStop>, Vec<EventKind>) {
    let events = Arc::new(MemoryEvents::default());
    let cancel = CancellationToken::new();
    let first_run = run.resume.is_none();
    let output = fx
        .runtime
        .run_turn(TurnInput {
            origin: origin(run.task).into(),
            agent: run.agent,
            history: &[],
            summary: None,
            loaded_skills: &[],
            plan: None,
            skills: None,
            input: "go".into(),
            input_images: Vec::new(),
            depth: 0,
            events: events.clone(),
            cancel: &cancel,
            resume: run.resume.map(Box::new),
            first_run,
            checkpoints: Some(run.checkpoints),
            approvals: run.approvals.map(|a| a as _),
            controls: None,
            recorded: None,
        })
        .await;
    (output, events.events())
}

#[tokio::test]
async fn a_multi_step_turn_with_parallel_calls_and_a_subagent_runs_in_memory_and_resumes() {
    let fx = fixture();
    let helper = agent("helper", vec![], PermissionPolicy::default());
    let lead = agent("lead", vec![helper], PermissionPolicy::default());
    let checkpoints = MemoryCheckpoints::default();
    let (output, events) = run(
        &fx,
        Run {
            agent: &lead,
            task: "t1",
            resume: None,
            checkpoints: &checkpoints,
            approvals: None,
        },
    )
    .await;
    let output = output.expect("the turn ends");
    assert_eq!(output.status, TurnStatus::Completed);
    let answer = output.answer.clone().expect("an answer");
    assert!(answer.contains("helper saw echo c"), "{answer}");
    assert!(answer.contains("echo d"), "{answer}");
    assert_eq!(output.iterations, 3);
    // a, b (parallel), the helper's c, d; the subagent call itself is one more run.
    assert_eq!(fx.echoes.load(Ordering::SeqCst), 4);
    assert_eq!(fx.tools.runs().len(), 5, "{:?}", fx.tools.runs());
    let started = events
        .iter()
        .filter(|e| matches!(e, EventKind::ToolStarted { .. }))
        .count();
    assert_eq!(started, 4, "the lead's own calls: a, b, spawn, d");
    // Every decision is in the event stream, a plain allow included.
    assert!(events.iter().all(|e| match e {
        EventKind::ToolStarted {
            permission, rule, ..
        } => *permission == Some(Verdict::Allowed) && !rule.is_empty(),
        _ => true,
    }));

    // Resume from the checkpoint of the second step (before its calls were dispatched): the
    // recorded calls come back, nothing runs again, and the turn ends the same way.
    let checkpoint = checkpoints.latest().expect("a checkpoint");
    assert_eq!(checkpoint.iterations, 2);
    let (resumed, _) = run(
        &fx,
        Run {
            agent: &lead,
            task: "t1",
            resume: Some(checkpoint),
            checkpoints: &checkpoints,
            approvals: None,
        },
    )
    .await;
    let resumed = resumed.expect("the resumed turn ends");
    assert_eq!(resumed.answer, output.answer);
    assert_eq!(fx.echoes.load(Ordering::SeqCst), 4, "no call ran twice");
    assert_eq!(fx.tools.runs().len(), 5);
}

#[tokio::test]
async fn an_asked_call_suspends_the_turn_and_runs_once_after_approval() {
    let fx = fixture();
    let guarded = agent("guarded", vec![], PermissionPolicy::default());
    let checkpoints = MemoryCheckpoints::default();
    let approvals = MemoryApprovals::default();
    let first = Run {
        agent: &guarded,
        task: "t2",
        resume: None,
        checkpoints: &checkpoints,
        approvals: Some(&approvals),
    };
    let (stopped, events) = run(&fx, first).await;
    let Err(TurnStop::AwaitingApproval(awaiting)) = stopped else {
        panic!("expected a suspension, got {stopped:?}");
    };
    assert_eq!(
        awaiting.expires_at_ms, None,
        "no approval timeout: no expiry"
    );
    let pending = awaiting.calls;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool, "delete");
    assert!(
        pending[0].rule.contains("destructive"),
        "{}",
        pending[0].rule
    );
    assert!(events.iter().any(|e| matches!(e,
        EventKind::ApprovalRequested { tool, .. } if tool == "delete")));
    assert_eq!(
        fx.deletes.load(Ordering::SeqCst),
        0,
        "nothing ran while waiting"
    );

    let call_id = pending[0].call_id.clone();
    approvals.update(|a| {
        a.requested.push(call_id.clone());
        a.by_call.insert(
            call_id.clone(),
            ApprovalAnswer {
                approve: true,
                reason: String::new(),
                by: "alice".into(),
                at_ms: 0,
            },
        );
    });
    let again = Run {
        agent: &guarded,
        task: "t2",
        resume: checkpoints.latest(),
        checkpoints: &checkpoints,
        approvals: Some(&approvals),
    };
    let (output, events) = run(&fx, again).await;
    let output = output.expect("the turn ends after approval");
    assert_eq!(
        output.answer.as_deref(),
        Some("after approval: deleted old.txt")
    );
    assert!(output.asked_approval);
    assert_eq!(
        fx.deletes.load(Ordering::SeqCst),
        1,
        "the approved call ran once"
    );
    assert!(events.iter().any(|e| matches!(e,
        EventKind::ApprovalResolved { verdict: Verdict::Approved, by, .. } if by == "alice")));
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EventKind::ApprovalRequested { .. })),
        "an announced request is not announced again"
    );
}

#[tokio::test]
async fn a_refused_call_is_an_observation_with_the_reason() {
    let fx = fixture();
    let guarded = agent("guarded", vec![], PermissionPolicy::default());
    let checkpoints = MemoryCheckpoints::default();
    let approvals = MemoryApprovals::default();
    let first = Run {
        agent: &guarded,
        task: "t3",
        resume: None,
        checkpoints: &checkpoints,
        approvals: Some(&approvals),
    };
    let (stopped, _) = run(&fx, first).await;
    let Err(TurnStop::AwaitingApproval(awaiting)) = stopped else {
        panic!("expected a suspension");
    };
    let pending = awaiting.calls;
    approvals.update(|a| {
        a.by_call.insert(
            pending[0].call_id.clone(),
            ApprovalAnswer {
                approve: false,
                reason: "keep it".into(),
                by: "bob".into(),
                at_ms: 0,
            },
        );
    });
    let again = Run {
        agent: &guarded,
        task: "t3",
        resume: checkpoints.latest(),
        checkpoints: &checkpoints,
        approvals: Some(&approvals),
    };
    let (output, _) = run(&fx, again).await;
    let answer = output.expect("ends").answer.expect("answer");
    assert!(answer.contains("denied by bob: keep it"), "{answer}");
    assert_eq!(fx.deletes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn without_an_approval_gate_an_ask_is_denied_and_a_deny_rule_wins() {
    let fx = fixture();
    // No gate (a subagent's loop): the destructive call is denied, not suspended.
    let guarded = agent("guarded", vec![], PermissionPolicy::default());
    let checkpoints = MemoryCheckpoints::default();
    let (output, _) = run(
        &fx,
        Run {
            agent: &guarded,
            task: "t4",
            resume: None,
            checkpoints: &checkpoints,
            approvals: None,
        },
    )
    .await;
    let answer = output.expect("ends").answer.expect("answer");
    assert!(answer.contains("denied by"), "{answer}");

    // A deny rule refuses even in bypass mode.
    let policy = PermissionPolicy {
        mode: Some(skein_common::protocol::PermissionMode::Bypass),
        deny: vec!["delete(*.txt)".into()],
        ..PermissionPolicy::default()
    };
    let denied = agent("guarded", vec![], policy);
    let approvals = MemoryApprovals::default();
    let (output, events) = run(
        &fx,
        Run {
            agent: &denied,
            task: "t5",
            resume: None,
            checkpoints: &checkpoints,
            approvals: Some(&approvals),
        },
    )
    .await;
    let answer = output.expect("ends").answer.expect("answer");
    assert!(answer.contains("deny rule delete(*.txt)"), "{answer}");
    assert!(events.iter().any(|e| matches!(
        e,
        EventKind::ApprovalResolved {
            verdict: Verdict::Denied,
            ..
        }
    )));
    assert!(events.iter().any(|e| matches!(
        e,
        EventKind::ToolStarted {
            permission: Some(Verdict::Denied),
            rule,
            ..
        } if rule.contains("delete(*.txt)")
    )));
    assert_eq!(fx.deletes.load(Ordering::SeqCst), 0);
}

/// Records the hooks' order, rewrites the answer after the turn, and answers `delete` calls in
/// the tool's place.
struct Guard {
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl skein_common::agent::middleware::hooks::TurnHook for Guard {
    fn after_turn<'a>(
        &'a self,
        _: &'a skein_common::agent::middleware::hooks::TurnContext,
        mut summary: skein_common::agent::middleware::hooks::TurnSummary,
    ) -> futures::future::BoxFuture<'a, skein_common::agent::middleware::hooks::TurnSummary> {
        self.log.lock().expect("log").push("after_turn".into());
        summary.answer = summary.answer.map(|a| format!("[guarded] {a}"));
        Box::pin(async move { summary })
    }

    fn before_acting<'a>(
        &'a self,
        _: &'a skein_common::agent::middleware::hooks::TurnContext,
        call: skein_common::protocol::message::ToolCall,
    ) -> futures::future::BoxFuture<
        'a,
        Result<skein_common::protocol::message::ToolCall, skein_common::protocol::CallOutcome>,
    > {
        self.log
            .lock()
            .expect("log")
            .push(format!("before_acting {}", call.name));
        let outcome = (call.name == "delete")
            .then(|| skein_common::protocol::CallOutcome::ok("pretended to delete"));
        Box::pin(async move { outcome.map_or(Ok(call), Err) })
    }
}

#[tokio::test]
async fn hooks_can_answer_for_a_tool_and_rewrite_the_turns_answer() {
    let base = fixture();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let middleware = Middleware::new().hook(Arc::new(Guard { log: log.clone() }));
    let runtime = runtime_over(&base.tools, SCENARIO, SkillCatalog::default(), middleware);
    let fx = Fixture { runtime, ..base };
    // Bypass: the destructive call is allowed, and the hook answers it in the tool's place.
    let policy = PermissionPolicy {
        mode: Some(skein_common::protocol::PermissionMode::Bypass),
        ..PermissionPolicy::default()
    };
    let guarded = agent("guarded", vec![], policy);
    let checkpoints = MemoryCheckpoints::default();
    let (output, _) = run(
        &fx,
        Run {
            agent: &guarded,
            task: "t6",
            resume: None,
            checkpoints: &checkpoints,
            approvals: None,
        },
    )
    .await;
    let output = output.expect("ends");
    assert_eq!(
        output.answer.as_deref(),
        Some("[guarded] after approval: pretended to delete")
    );
    assert_eq!(
        output.new_messages.last().map(|m| m.content.as_str()),
        Some("[guarded] after approval: pretended to delete"),
        "the session keeps the rewritten answer"
    );
    assert_eq!(fx.deletes.load(Ordering::SeqCst), 0, "the tool never ran");
    assert_eq!(
        *log.lock().expect("log"),
        ["before_acting delete", "after_turn"]
    );
}

#[tokio::test]
async fn a_loaded_skill_stays_in_the_prompt_of_later_turns() {
    let base = fixture();
    let skills = SkillCatalog::from_documents([
        (
            "notes".to_string(),
            "+++\ndescription = \"keep notes\"\n+++\nOne line per fact.".to_string(),
        ),
        (
            "secret".to_string(),
            "+++\ndescription = \"hidden\"\n+++\nThe recipe.".to_string(),
        ),
    ])
    .expect("skills");
    let scenario = r#"{ "agents": { "learner": { "turns": [
        { "steps": [
            { "tool_calls": [ { "name": "load_skill", "arguments": { "name": "notes" } } ] },
            { "answer": "loaded: {{observations}}" } ] },
        { "steps": [ { "answer": "second" } ] }
    ] } } }"#;
    let prompts = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = prompts.clone();
    let middleware = Middleware::new().model_layer(tower::util::MapRequestLayer::new(
        move |call: skein_common::agent::seams::ModelCall| {
            let system = call.request.messages[0].content.clone();
            seen.lock().expect("prompts").push(system);
            call
        },
    ));
    let runtime = runtime_over(&base.tools, scenario, skills, middleware);
    let mut learner = agent("learner", vec![], PermissionPolicy::default());
    learner.skills = Some(vec!["notes".into()]);
    let cancel = CancellationToken::new();
    let turn = |input: &str,
                history: Vec<skein_common::protocol::message::Message>,
                loaded: Vec<String>| {
        let (runtime, learner, cancel) = (runtime.clone(), learner.clone(), cancel.clone());
        let input = input.to_owned();
        async move {
            runtime
                .run_turn(TurnInput {
                    origin: origin("t7").into(),
                    agent: &learner,
                    history: &history,
                    summary: None,
                    loaded_skills: &loaded,
                    plan: None,
                    skills: None,
                    input,
                    input_images: Vec::new(),
                    depth: 0,
                    events: Arc::new(MemoryEvents::default()),
                    cancel: &cancel,
                    resume: None,
                    first_run: true,
                    checkpoints: None,
                    approvals: None,
                    controls: None,
                    recorded: None,
                })
                .await
                .expect("ends")
        }
    };
    let first = turn("learn", vec![], vec![]).await;
    assert_eq!(first.loaded_skills, ["notes"]);
    assert!(first
        .answer
        .clone()
        .unwrap_or_default()
        .contains("One line per fact."));
    {
        let prompts = prompts.lock().expect("prompts");
        assert!(prompts[0].contains("- notes: keep notes"), "{}", prompts[0]);
        assert!(
            !prompts[0].contains("secret"),
            "only the skills it may load are listed"
        );
        assert!(!prompts[0].contains("One line per fact."), "not loaded yet");
    }
    let second = turn(
        "again",
        first.new_messages.clone(),
        first.loaded_skills.clone(),
    )
    .await;
    assert_eq!(second.answer.as_deref(), Some("second"));
    let prompts = prompts.lock().expect("prompts");
    let last = prompts.last().expect("a prompt");
    assert!(
        last.contains("Skill notes (loaded):\nOne line per fact."),
        "{last}"
    );
}

/// A tool directory that cannot be read (the registry is away).
struct UnreadableDirectory;

impl skein_common::agent::seams::ToolDirectory for UnreadableDirectory {
    fn current(
        &self,
    ) -> futures::future::BoxFuture<
        '_,
        Result<Arc<skein_common::agent::tools::ToolCatalog>, skein_common::protocol::Failure>,
    > {
        Box::pin(async {
            Err(skein_common::protocol::Failure::new(
                skein_common::protocol::FailureKind::Unavailable,
                "registry unreachable",
            ))
        })
    }
}

#[tokio::test]
async fn a_turn_whose_tool_catalog_cannot_be_read_stops_instead_of_running_without_tools() {
    let mut fx = fixture();
    let model = ScriptedModel::from_json(SCENARIO).expect("valid scenario");
    fx.runtime = Arc::new(Runtime::new(
        BoxCloneSyncService::new(ProviderService::new(model).map_err(Into::into)),
        BoxCloneSyncService::new(fx.tools.clone().map_err(Into::into)),
        Arc::new(UnreadableDirectory),
        SkillCatalog::default(),
        Middleware::new(),
        RuntimeSettings::default(),
    ));
    let lead = agent("lead", vec![], PermissionPolicy::default());
    let checkpoints = MemoryCheckpoints::default();
    let (output, events) = run(
        &fx,
        Run {
            agent: &lead,
            task: "t-catalog",
            resume: None,
            checkpoints: &checkpoints,
            approvals: None,
        },
    )
    .await;
    match output {
        Err(TurnStop::Interrupted(failure)) => {
            assert!(
                failure.message.contains("registry unreachable"),
                "{failure:?}"
            )
        }
        other => panic!("the turn must stop to run again, not end: {other:?}"),
    }
    assert!(fx.tools.runs().is_empty(), "no call ran");
    assert!(!events.iter().any(|e| matches!(e, EventKind::Final { .. })));
}
