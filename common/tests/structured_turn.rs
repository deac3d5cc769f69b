//! Structured answers in the runtime, in memory: every model call of a turn carries the agent's
//! output schema; a matching answer ends the turn with its parsed `output`; one that does not is
//! discarded and repaired once (a model call like any other), and a second failure ends the turn
//! `invalid_output` — also at the iteration limit, and when a hook rewrites the answer.

use std::sync::{Arc, Mutex};

use futures::FutureExt;
use serde_json::{json, Value};
use skein_common::agent::memory::{FixedDirectory, InMemoryTools, MemoryEvents, ToolFn};
use skein_common::agent::middleware::hooks::{TurnContext, TurnHook, TurnSummary};
use skein_common::agent::middleware::Middleware;
use skein_common::agent::model::{ModelRequest, ModelResponse};
use skein_common::agent::runtime::{Runtime, RuntimeSettings, TurnInput, TurnOutput};
use skein_common::agent::seams::{BoxError, ModelCall};
use skein_common::agent::skills::SkillCatalog;
use skein_common::agent::structured::is_repair_request;
use skein_common::protocol::message::{Message, Role, ToolCall, Usage};
use skein_common::protocol::{
    AgentSpec, EventKind, FailureKind, OutputSchema, TaskOrigin, ToolSpec, TurnStatus,
};
use tokio_util::sync::CancellationToken;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

/// One scripted reply: a text answer, or a call of `echo`.
#[derive(Clone)]
enum Reply {
    Text(&'static str),
    Echo,
}

/// What the model was asked, call by call.
type Asked = Arc<Mutex<Vec<ModelRequest>>>;

fn schema() -> OutputSchema {
    OutputSchema::new(json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1},
        },
        "required": ["city", "days"],
        "additionalProperties": false,
    }))
}

fn agent(max_iterations: u32, structured: bool) -> AgentSpec {
    AgentSpec {
        name: "planner".into(),
        description: String::new(),
        system_prompt: "Plan trips.".into(),
        model: String::new(),
        tools: vec!["*".into()],
        subagents: Vec::new(),
        max_iterations,
        permissions: Default::default(),
        skills: None,
        context_tokens: None,
        fallback_models: Vec::new(),
        planning: false,
        max_parallel_steps: None,
        max_concurrency: None,
        budget: None,
        output_schema: structured.then(schema),
    }
}

/// A runtime whose model plays `replies` in turn (streaming each text as one delta), keeping
/// every request, with an `echo` tool.
fn runtime_with(replies: Vec<Reply>, middleware: Middleware) -> (Runtime, Asked) {
    let replies = Arc::new(Mutex::new(replies));
    let asked: Asked = Arc::default();
    let kept = asked.clone();
    let model = tower::service_fn(move |call: ModelCall| {
        let (replies, kept) = (replies.clone(), kept.clone());
        async move {
            kept.lock().expect("asked").push(call.request.clone());
            let reply = replies.lock().expect("replies").remove(0);
            let message = match reply {
                Reply::Text(text) => {
                    if let Some(deltas) = &call.deltas {
                        deltas.delta(text.to_owned()).await;
                    }
                    Message::assistant(text)
                }
                Reply::Echo => {
                    let mut message = Message::assistant("");
                    message.tool_calls = vec![ToolCall {
                        id: format!("call_{}", kept.lock().expect("asked").len()),
                        name: "echo".into(),
                        arguments: json!({"text": "Oslo"}),
                    }];
                    message
                }
            };
            Ok::<_, BoxError>(ModelResponse {
                message,
                finish_reason: Some("stop".into()),
                usage: Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                    ..Usage::default()
                },
            })
        }
    });
    let echo: ToolFn = Arc::new(|args: Value| {
        let text = args["text"].as_str().unwrap_or_default().to_owned();
        async move { Ok(format!("echo {text}")) }.boxed()
    });
    let tools = InMemoryTools::new([(
        ToolSpec {
            name: "echo".into(),
            description: "Echoes.".into(),
            parameters: json!({"type": "object"}),
            concurrency_safe: true,
            effects: Default::default(),
        },
        echo,
    )]);
    let runtime = Runtime::new(
        BoxCloneSyncService::new(model),
        BoxCloneSyncService::new(tools.clone().map_err(Into::into)),
        Arc::new(FixedDirectory(Arc::new(tools.catalog()))),
        SkillCatalog::default(),
        middleware,
        RuntimeSettings {
            default_model: "m".into(),
            provider: "test".into(),
            ..RuntimeSettings::default()
        },
    );
    (runtime, asked)
}

async fn run_turn(runtime: &Runtime, agent: &AgentSpec) -> (TurnOutput, Vec<EventKind>) {
    let events = Arc::new(MemoryEvents::default());
    let cancel = CancellationToken::new();
    let output = runtime
        .run_turn(TurnInput {
            origin: TaskOrigin {
                task_id: "t1".into(),
                tenant: "acme".into(),
                user: "u".into(),
                session: "s1".into(),
                workspace: "s1".into(),
                deadline_ms: None,
                budget: None,
                run_budget: None,
            }
            .into(),
            agent,
            history: &[],
            summary: None,
            loaded_skills: &[],
            plan: None,
            skills: None,
            input: "a trip, please".into(),
            input_images: Vec::new(),
            depth: 0,
            events: events.clone(),
            cancel: &cancel,
            resume: None,
            first_run: true,
            checkpoints: None,
            approvals: None,
            controls: None,
            recorded: None,
        })
        .await
        .expect("the turn ends");
    (output, events.events())
}

fn discards(events: &[EventKind]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match event {
            EventKind::OutputDiscarded { failure } => {
                assert_eq!(failure.kind, FailureKind::InvalidOutput);
                Some(failure.message.clone())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_matching_answer_ends_the_turn_with_its_parsed_output() {
    let (runtime, asked) = runtime_with(
        vec![
            Reply::Echo,
            Reply::Text("```json\n{\"city\": \"Oslo\", \"days\": 3}\n```"),
        ],
        Middleware::new(),
    );
    let (output, events) = run_turn(&runtime, &agent(4, true)).await;
    assert_eq!(output.status, TurnStatus::Completed, "{:?}", output.failure);
    assert_eq!(output.output, Some(json!({"city": "Oslo", "days": 3})));
    assert_eq!(
        output.answer.as_deref(),
        Some("{\"city\": \"Oslo\", \"days\": 3}"),
        "the answer is the JSON, its fence taken off"
    );
    assert_eq!(output.iterations, 2);
    assert!(discards(&events).is_empty());
    let asked = asked.lock().expect("asked").clone();
    assert_eq!(asked.len(), 2);
    for request in asked.iter() {
        assert_eq!(request.output_schema.as_deref(), Some(&schema()));
        assert!(
            request.tools.iter().any(|t| t.name == "echo"),
            "tools beside it"
        );
    }

    // Without a schema, nothing is checked or sent.
    let (runtime, asked) = runtime_with(vec![Reply::Text("Oslo, 3 days")], Middleware::new());
    let (output, _) = run_turn(&runtime, &agent(4, false)).await;
    assert_eq!(output.status, TurnStatus::Completed);
    assert_eq!(output.answer.as_deref(), Some("Oslo, 3 days"));
    assert_eq!(output.output, None);
    assert!(asked.lock().expect("asked")[0].output_schema.is_none());
}

#[tokio::test]
async fn an_answer_that_does_not_match_is_discarded_and_repaired_once() {
    let (runtime, asked) = runtime_with(
        vec![
            Reply::Text(r#"{"city": "Oslo", "days": 0}"#),
            Reply::Text(r#"{"city": "Oslo", "days": 2}"#),
        ],
        Middleware::new(),
    );
    let (output, events) = run_turn(&runtime, &agent(4, true)).await;
    assert_eq!(output.status, TurnStatus::Completed, "{:?}", output.failure);
    assert_eq!(output.output, Some(json!({"city": "Oslo", "days": 2})));
    assert_eq!(output.iterations, 2, "the repair is a model call");
    assert_eq!(output.usage.completion_tokens, 10);
    let discarded = discards(&events);
    assert_eq!(discarded.len(), 1);
    assert!(
        discarded[0].contains("/days: 0 is less than the minimum 1"),
        "{discarded:?}"
    );
    // The second request ends with the repair request, which names what was wrong.
    let asked = asked.lock().expect("asked");
    let repair = asked[1].messages.last().expect("a last message");
    assert!(is_repair_request(repair), "{repair:?}");
    assert!(repair
        .content
        .contains("/days: 0 is less than the minimum 1"));
    // The turn's messages keep what happened: the answer, the repair request, the repair.
    let roles: Vec<Role> = output.new_messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::User, Role::Assistant]
    );
}

#[tokio::test]
async fn a_second_answer_that_does_not_match_ends_the_turn_invalid_output() {
    let (runtime, asked) = runtime_with(
        vec![
            Reply::Text("Oslo for three days"),
            Reply::Text(r#"{"city": "Oslo", "days": 3, "hotel": "yes"}"#),
            Reply::Text("never asked"),
        ],
        Middleware::new(),
    );
    let (output, events) = run_turn(&runtime, &agent(4, true)).await;
    assert_eq!(output.status, TurnStatus::InvalidOutput);
    let failure = output.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::InvalidOutput);
    assert!(
        failure
            .message
            .contains("(root): the property \"hotel\" is not allowed"),
        "{failure}"
    );
    assert!(
        failure.message.contains("after one repair attempt"),
        "{failure}"
    );
    assert_eq!(
        output.answer.as_deref(),
        Some(r#"{"city": "Oslo", "days": 3, "hotel": "yes"}"#)
    );
    assert_eq!(output.output, None);
    assert_eq!(output.iterations, 2);
    assert_eq!(asked.lock().expect("asked").len(), 2, "one repair, no more");
    let discarded = discards(&events);
    assert_eq!(discarded.len(), 1);
    assert!(discarded[0].contains("not JSON"), "{discarded:?}");
}

#[tokio::test]
async fn the_summary_at_the_iteration_limit_is_checked_and_repaired_too() {
    let (runtime, asked) = runtime_with(
        vec![
            Reply::Echo,
            Reply::Text(r#"{"city": "Oslo"}"#),
            Reply::Text(r#"{"city": "Oslo", "days": 1}"#),
        ],
        Middleware::new(),
    );
    let (output, events) = run_turn(&runtime, &agent(1, true)).await;
    assert_eq!(output.status, TurnStatus::Completed, "{:?}", output.failure);
    assert!(output.limit_reached);
    assert_eq!(output.output, Some(json!({"city": "Oslo", "days": 1})));
    assert_eq!(output.iterations, 3);
    assert_eq!(discards(&events).len(), 1);
    let asked = asked.lock().expect("asked");
    for summary in &asked[1..] {
        assert!(summary.tools.is_empty(), "no tools for the summary");
        assert_eq!(summary.output_schema.as_deref(), Some(&schema()));
        let note = summary.messages.last().expect("the limit's note");
        assert!(note.content.contains("required JSON format"), "{note:?}");
    }
    assert!(asked[2].messages.iter().any(is_repair_request));
}

/// Rewrites the turn's answer to `to`.
struct Rewrite {
    to: &'static str,
}

impl TurnHook for Rewrite {
    fn after_turn<'a>(
        &'a self,
        _: &'a TurnContext,
        mut summary: TurnSummary,
    ) -> futures::future::BoxFuture<'a, TurnSummary> {
        summary.answer = Some(self.to.to_owned());
        Box::pin(async move { summary })
    }
}

#[tokio::test]
async fn an_answer_a_hook_rewrites_is_checked_again() {
    let valid = r#"{"city": "Bergen", "days": 5}"#;
    let middleware = Middleware::new().hook(Arc::new(Rewrite { to: valid }));
    let (runtime, _) = runtime_with(
        vec![Reply::Text(r#"{"city": "Oslo", "days": 3}"#)],
        middleware,
    );
    let (output, _) = run_turn(&runtime, &agent(4, true)).await;
    assert_eq!(output.status, TurnStatus::Completed);
    assert_eq!(output.output, Some(json!({"city": "Bergen", "days": 5})));

    let middleware = Middleware::new().hook(Arc::new(Rewrite { to: "[redacted]" }));
    let (runtime, _) = runtime_with(
        vec![Reply::Text(r#"{"city": "Oslo", "days": 3}"#)],
        middleware,
    );
    let (output, _) = run_turn(&runtime, &agent(4, true)).await;
    assert_eq!(output.status, TurnStatus::InvalidOutput);
    assert_eq!(output.output, None);
    let failure = output.failure.expect("a failure");
    assert!(failure.message.contains("hooks left it"), "{failure}");
}

#[tokio::test]
async fn a_spec_whose_schema_cannot_be_checked_fails_the_turn_without_a_model_call() {
    let mut forged = agent(4, true);
    forged.output_schema = Some(OutputSchema::new(json!({"type": "object", "if": {}})));
    let (runtime, asked) = runtime_with(vec![Reply::Text("{}")], Middleware::new());
    let (output, _) = run_turn(&runtime, &forged).await;
    assert_eq!(output.status, TurnStatus::Failed);
    let failure = output.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::InvalidInput);
    assert!(failure.message.contains("unsupported keyword"), "{failure}");
    assert!(asked.lock().expect("asked").is_empty());
}
