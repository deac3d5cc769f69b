//! `Runtime`: the ReAct loop that runs one agent turn, the same code on the lead (user turns) and
//! on workers (subagent turns).
//!
//! One turn: assemble the system prompt from sections, send the prepared history and the turn's
//! tool snapshot to the model (streaming deltas as events), dispatch the tool calls it asks for
//! (independent calls in parallel, calls marked not concurrency-safe one at a time, results back in
//! the model's order), observe, repeat — until the model answers or the iteration limit is reached,
//! which ends with a summary answer rather than an error.
//!
//! The loop never panics on model or tool misbehaviour: unknown tools, bad arguments and failed
//! calls become observations the model can react to; a failed model call ends the turn with a
//! failure as data.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::context::{self, ContextLimits};
use crate::agent::events::EventSink;
use crate::agent::hooks::Hooks;
use crate::agent::message::{Message, Role, ToolCall, Usage};
use crate::agent::model::{ModelChunk, ModelClient, ModelError, ModelRequest, ModelResponse};
use crate::agent::prompt::{priority, SystemPrompt};
use crate::agent::skills::SkillCatalog;
use crate::dispatch::catalog::{LiveCatalog, CATALOG_MAX_AGE};
use crate::dispatch::{failed, CallRoute, Dispatcher, ToolCatalog};
use crate::protocol::{
    AgentSpec, CallOutcome, EventKind, Failure, FailureKind, TaskOrigin, ToolResult, ToolSpec,
    TurnStatus,
};
use crate::store::{SessionStore, TurnCheckpoint};

/// Name of the tool through which an agent hands a subtask to one of its subagents.
pub const SPAWN_TOOL: &str = "spawn_agent";

/// Longest preview of an observation carried in a `tool_finished` event.
const PREVIEW_CHARS: usize = 200;

/// Limits and defaults of a runtime.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Model used when an agent names none.
    pub default_model: String,
    /// The model provider's name, for telemetry (`openai`, `scripted`).
    pub provider: String,
    pub tool_timeout: Duration,
    pub subagent_timeout: Duration,
    /// Deepest subagent nesting allowed (a user's agent is depth 0).
    pub max_depth: u32,
    pub context: ContextLimits,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            default_model: "gpt-4o-mini".into(),
            provider: "openai".into(),
            tool_timeout: Duration::from_secs(60),
            subagent_timeout: Duration::from_secs(300),
            max_depth: 2,
            context: ContextLimits::default(),
        }
    }
}

/// What a turn needs to run.
pub struct TurnInput<'a> {
    /// The task and the session this loop runs in.
    pub origin: TaskOrigin,
    pub agent: &'a AgentSpec,
    /// The session's history before this turn.
    pub history: &'a [Message],
    pub input: String,
    /// 0 for a user's turn, n for a subagent n levels down.
    pub depth: u32,
    pub events: &'a EventSink,
    pub cancel: &'a CancellationToken,
    /// Progress of an earlier run of this turn to continue from.
    pub resume: Option<TurnCheckpoint>,
    /// True when no earlier run of this turn can have dispatched its calls (its first delivery
    /// and first attempt, nothing to resume). Otherwise each call is looked for among the
    /// recorded results before it is dispatched, and workers look again before running it.
    pub first_run: bool,
    /// Where to record progress before each step's calls are dispatched; `None` records nothing.
    pub checkpoints: Option<&'a Checkpoints>,
}

/// Why a turn stopped without ending: it was cancelled, or its progress could not be recorded
/// (the session lease was lost, or Redis went away). The turn has no result; it may run again.
#[derive(Debug, Clone, PartialEq)]
pub struct Interrupted(pub Failure);

/// Where a turn records its progress (before each step's calls are dispatched), fenced by the
/// session lease: a lead that lost the lease cannot overwrite the progress of the lead that took
/// it over.
pub struct Checkpoints {
    pub store: SessionStore,
    pub tenant: String,
    pub session: String,
    pub task_id: String,
    pub lease_token: String,
}

impl Checkpoints {
    async fn save(&self, state: &TurnCheckpoint) -> Result<(), Failure> {
        let saved = self
            .store
            .save_checkpoint(
                &self.tenant,
                &self.session,
                &self.task_id,
                &self.lease_token,
                state,
            )
            .await
            .map_err(|e| e.to_failure())?;
        if saved {
            Ok(())
        } else {
            Err(Failure::new(
                FailureKind::Unavailable,
                "session lease lost; progress not recorded",
            ))
        }
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutput {
    pub status: TurnStatus,
    pub answer: Option<String>,
    pub failure: Option<Failure>,
    pub iterations: u32,
    pub limit_reached: bool,
    pub usage: Usage,
    /// Messages this turn adds to the session: the user's input, the model's messages and the
    /// observations.
    pub new_messages: Vec<Message>,
}

/// Runs agent turns with one model provider and one dispatcher.
pub struct Runtime<M> {
    model: M,
    dispatcher: Dispatcher,
    /// The live workers' tools, shared by this runtime's turns.
    catalog: LiveCatalog,
    skills: SkillCatalog,
    hooks: Hooks,
    settings: RuntimeSettings,
    metrics: crate::metrics::Metrics,
}

impl<M: ModelClient> Runtime<M> {
    pub fn new(
        model: M,
        dispatcher: Dispatcher,
        store: SessionStore,
        skills: SkillCatalog,
        hooks: Hooks,
        settings: RuntimeSettings,
    ) -> Self {
        Self {
            model,
            dispatcher,
            catalog: LiveCatalog::new(store, CATALOG_MAX_AGE),
            skills,
            hooks,
            settings,
            metrics: crate::metrics::Metrics::new(),
        }
    }

    /// Counts model calls into `metrics` (the process's registry) instead of a private one.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// Runs one turn to its end, or resumes it from `turn.resume`. `Err` means the turn was
    /// interrupted (cancelled, or its checkpoint could not be written) and did not end: the
    /// caller decides whether it runs again.
    pub async fn run_turn(&self, turn: TurnInput<'_>) -> Result<TurnOutput, Interrupted> {
        let span = tracing::info_span!(
            "invoke_agent",
            "otel.name" = format!("invoke_agent {}", turn.agent.name),
            "gen_ai.operation.name" = "invoke_agent",
            "gen_ai.agent.name" = %turn.agent.name,
            "gen_ai.conversation.id" = %turn.origin.session,
            "skein.task_id" = %turn.origin.task_id,
            "skein.tenant" = %turn.origin.tenant,
            "skein.depth" = turn.depth,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let result = self.run_turn_steps(turn).instrument(span.clone()).await;
        match &result {
            Ok(TurnOutput {
                failure: Some(failure),
                ..
            })
            | Err(Interrupted(failure)) => {
                record_failure(&span, failure);
            }
            Ok(_) => {}
        }
        result
    }

    async fn run_turn_steps(&self, turn: TurnInput<'_>) -> Result<TurnOutput, Interrupted> {
        let mut out = TurnOutput {
            status: TurnStatus::Completed,
            answer: None,
            failure: None,
            iterations: 0,
            limit_reached: false,
            usage: Usage::default(),
            new_messages: vec![Message::user(turn.input.clone())],
        };
        if let Some(resumed) = turn.resume.clone() {
            out.new_messages = resumed.new_messages;
            out.iterations = resumed.iterations;
            out.usage = resumed.usage;
        }
        let catalog = match self.catalog.current().await {
            Ok(catalog) => catalog,
            Err(e) => {
                turn.events
                    .emit(EventKind::Warning {
                        failure: e.to_failure(),
                    })
                    .await;
                Arc::new(ToolCatalog::default())
            }
        };
        let can_spawn = !turn.agent.subagents.is_empty() && turn.depth < self.settings.max_depth;
        let spawn = can_spawn.then(|| spawn_tool_spec(&turn.agent.subagents));
        let tools = catalog.tools_for(&turn.agent.tools, spawn);
        let system = self.system_prompt(&turn);
        let history = context::prepare(turn.history, self.settings.context);

        loop {
            interrupted_if_cancelled(&turn)?;
            match out.new_messages.last() {
                // Calls asked for but not yet observed (also when resuming after a crash): run
                // them. Calls already recorded are not run again: the dispatcher returns their
                // recorded results.
                Some(last) if last.role == Role::Assistant && !last.tool_calls.is_empty() => {
                    let calls = last.tool_calls.clone();
                    let results = self
                        .execute_calls(&turn, out.iterations, &catalog, &tools, &calls)
                        .await;
                    if results.iter().any(stopped_by_cancel) {
                        // A worker stopped a call on the task's cancel request, which may reach
                        // this turn later: the turn stops now, as it would on hearing it.
                        turn.cancel.cancel();
                    }
                    interrupted_if_cancelled(&turn)?;
                    for (call, result) in calls.iter().zip(results) {
                        out.new_messages
                            .push(Message::tool_result(&call.id, result.outcome.observation()));
                    }
                    // No checkpoint here: the results are recorded by call key, so a turn that
                    // resumes from the checkpoint of these calls gets them back without running
                    // them again; the next step's checkpoint carries them.
                    continue;
                }
                // An answer: the turn ends.
                Some(last) if last.role == Role::Assistant => {
                    out.answer = Some(last.content.clone());
                    return Ok(out);
                }
                _ => {}
            }
            if out.iterations >= turn.agent.max_iterations {
                break;
            }
            let messages = conversation(&system, &history, &out.new_messages);
            let response = match self.model_call(&turn, messages, tools.clone()).await {
                Ok(response) => response,
                Err(failure) => return finished_failed(&turn, out, failure),
            };
            out.iterations += 1;
            out.usage.add(response.usage);
            let asks_for_tools = !response.message.tool_calls.is_empty();
            out.new_messages.push(response.message);
            // Calls are checkpointed before they are dispatched, so a resumed turn dispatches the
            // same calls (whose results are recorded) rather than asking the model again. An
            // answer is not: the turn ends next, atomically with its final result, and a turn
            // resumed before that asks the model once more.
            if asks_for_tools {
                checkpoint(&turn, &out).await?;
            }
        }

        // Iteration limit: one more call, without tools, for a summary answer.
        out.limit_reached = true;
        let mut messages = conversation(&system, &history, &out.new_messages);
        messages.push(Message::system(format!(
            "You have used all {} steps allowed for this turn. Do not call tools. Answer now: \
             summarise what you found and what is left to do.",
            turn.agent.max_iterations
        )));
        match self.model_call(&turn, messages, Arc::from([])).await {
            Ok(response) => {
                out.iterations += 1;
                out.usage.add(response.usage);
                let mut message = response.message;
                message.tool_calls.clear();
                out.answer = Some(message.content.clone());
                out.new_messages.push(message);
                Ok(out)
            }
            Err(failure) => finished_failed(&turn, out, failure),
        }
    }

    fn system_prompt(&self, turn: &TurnInput<'_>) -> String {
        let mut prompt = SystemPrompt::default();
        prompt.add("agent", priority::AGENT, turn.agent.system_prompt.clone());
        if !turn.agent.subagents.is_empty() && turn.depth < self.settings.max_depth {
            let mut roster =
                format!("You can hand subtasks to these agents with the {SPAWN_TOOL} tool:\n");
            for sub in &turn.agent.subagents {
                roster.push_str(&format!("- {}: {}\n", sub.name, sub.description));
            }
            prompt.add("subagents", priority::SUBAGENTS, roster);
        }
        if turn.depth == 0 {
            if let Some(skills) = self.skills.prompt_section() {
                prompt.add("skills", priority::SKILLS, skills);
            }
        }
        prompt.add(
            "context",
            priority::CONTEXT,
            format!(
                "Session {} of tenant {}. Files you write persist in the workspace of session {}.",
                turn.origin.session, turn.origin.tenant, turn.origin.workspace
            ),
        );
        self.hooks.transform_prompt(turn.agent, prompt.render())
    }

    /// One streamed model call; deltas become events.
    async fn model_call(
        &self,
        turn: &TurnInput<'_>,
        messages: Vec<Message>,
        tools: Arc<[ToolSpec]>,
    ) -> Result<ModelResponse, Failure> {
        let model = if turn.agent.model.is_empty() {
            self.settings.default_model.clone()
        } else {
            turn.agent.model.clone()
        };
        let span = tracing::info_span!(
            "chat",
            "otel.name" = format!("chat {model}"),
            "otel.kind" = "client",
            "gen_ai.operation.name" = "chat",
            "gen_ai.provider.name" = %self.settings.provider,
            "gen_ai.request.model" = %model,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "gen_ai.response.finish_reasons" = tracing::field::Empty,
            "gen_ai.input.messages" = tracing::field::Empty,
            "gen_ai.output.messages" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        if crate::telemetry::record_content() {
            span.record(
                "gen_ai.input.messages",
                serde_json::to_string(&messages).unwrap_or_default(),
            );
        }
        let request = ModelRequest {
            model,
            agent: turn.agent.name.clone(),
            messages,
            tools,
        };
        let started = std::time::Instant::now();
        let result = self
            .stream_model(turn, request)
            .instrument(span.clone())
            .await;
        let duration = started.elapsed();
        match &result {
            Ok(response) => {
                span.record("gen_ai.usage.input_tokens", response.usage.prompt_tokens);
                span.record(
                    "gen_ai.usage.output_tokens",
                    response.usage.completion_tokens,
                );
                if let Some(reason) = &response.finish_reason {
                    span.record("gen_ai.response.finish_reasons", reason.as_str());
                }
                if crate::telemetry::record_content() {
                    span.record("gen_ai.output.messages", response.message.content.as_str());
                }
                self.metrics.model_call(
                    &self.settings.provider,
                    "ok",
                    duration,
                    response.usage.prompt_tokens,
                    response.usage.completion_tokens,
                );
            }
            Err(failure) => {
                record_failure(&span, failure);
                self.metrics.model_call(
                    &self.settings.provider,
                    failure.kind.as_str(),
                    duration,
                    0,
                    0,
                );
            }
        }
        result
    }

    /// Streams one model answer, forwarding text deltas as events.
    async fn stream_model(
        &self,
        turn: &TurnInput<'_>,
        request: ModelRequest,
    ) -> Result<ModelResponse, Failure> {
        let streamed = async {
            let mut stream = self.model.stream(request).await?;
            while let Some(chunk) = stream.next().await {
                match chunk? {
                    ModelChunk::Delta(text) => {
                        turn.events.emit(EventKind::ModelDelta { text }).await;
                    }
                    ModelChunk::Done(response) => return Ok(response),
                }
            }
            Err(ModelError::BadResponse(
                "stream ended without a response".into(),
            ))
        };
        tokio::select! {
            _ = turn.cancel.cancelled() => Err(Failure::new(FailureKind::Cancelled, "turn cancelled")),
            result = streamed => result.map_err(|e| e.to_failure()),
        }
    }

    /// Runs the calls of one model response; results come back in the calls' order.
    async fn execute_calls(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        catalog: &ToolCatalog,
        tools: &[ToolSpec],
        calls: &[ToolCall],
    ) -> Vec<ToolResult> {
        if let Some(duplicate) = duplicate_call_id(calls) {
            // Results are keyed by call id within a step: two calls with one id cannot both be
            // answered.
            let failure = Failure::new(
                FailureKind::InvalidArguments,
                format!(
                    "the model used call id {duplicate:?} twice in one response; no call was run"
                ),
            );
            return calls
                .iter()
                .map(|c| failed(&c.id, failure.clone()))
                .collect();
        }
        let mut results = Vec::with_capacity(calls.len());
        for batch in concurrency_batches(calls, tools) {
            let running = batch
                .iter()
                .map(|call| self.execute_call(turn, step, catalog, tools, call));
            let done = tokio::select! {
                _ = turn.cancel.cancelled() => None,
                done = futures::future::join_all(running) => Some(done),
            };
            match done {
                Some(done) => results.extend(done),
                None => results.extend(batch.iter().map(|call| {
                    failed(
                        &call.id,
                        Failure::new(FailureKind::Cancelled, "turn cancelled"),
                    )
                })),
            }
        }
        results
    }

    async fn execute_call(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        catalog: &ToolCatalog,
        tools: &[ToolSpec],
        call: &ToolCall,
    ) -> ToolResult {
        turn.events
            .emit(EventKind::ToolStarted {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: call.arguments.clone(),
            })
            .await;
        let span = tracing::info_span!(
            "execute_tool",
            "otel.name" = format!("execute_tool {}", call.name),
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = %call.name,
            "gen_ai.tool.call.id" = %call.id,
            "gen_ai.tool.call.arguments" = tracing::field::Empty,
            "gen_ai.tool.call.result" = tracing::field::Empty,
            "skein.worker_id" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        if crate::telemetry::record_content() {
            span.record("gen_ai.tool.call.arguments", call.arguments.to_string());
        }
        let result = self
            .route_call(turn, step, catalog, tools, call)
            .instrument(span.clone())
            .await;
        if !result.worker_id.is_empty() {
            span.record("skein.worker_id", result.worker_id.as_str());
        }
        match &result.outcome {
            CallOutcome::Failed { failure } => record_failure(&span, failure),
            CallOutcome::Ok { output } if crate::telemetry::record_content() => {
                span.record("gen_ai.tool.call.result", output.as_str());
            }
            CallOutcome::Ok { .. } => {}
        }
        turn.events
            .emit(EventKind::ToolFinished {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                ok: result.outcome.is_ok(),
                worker_id: result.worker_id.clone(),
                preview: result
                    .outcome
                    .observation()
                    .chars()
                    .take(PREVIEW_CHARS)
                    .collect(),
            })
            .await;
        result
    }

    async fn route_call(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        catalog: &ToolCatalog,
        tools: &[ToolSpec],
        call: &ToolCall,
    ) -> ToolResult {
        if !tools.iter().any(|t| t.name == call.name) {
            let known: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
            return failed(
                &call.id,
                Failure::new(
                    FailureKind::UnknownTool,
                    format!(
                        "unknown tool {:?}; available: {}",
                        call.name,
                        known.join(", ")
                    ),
                ),
            );
        }
        if call.name == SPAWN_TOOL {
            return self.spawn(turn, step, catalog, call).await;
        }
        let Some(pool) = catalog.pool_for_tool(&call.name) else {
            return failed(
                &call.id,
                Failure::new(
                    FailureKind::Unavailable,
                    format!("no live worker provides {:?}", call.name),
                ),
            );
        };
        let route = CallRoute {
            pool,
            timeout: self.settings.tool_timeout,
            may_have_run: !turn.first_run,
        };
        self.dispatcher
            .call_tool(
                &turn.origin,
                step,
                &call.id,
                &call.name,
                call.arguments.clone(),
                route,
            )
            .await
    }

    async fn spawn(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        catalog: &ToolCatalog,
        call: &ToolCall,
    ) -> ToolResult {
        let (agent, task) = match parse_spawn_arguments(&call.arguments) {
            Ok(parsed) => parsed,
            Err(failure) => return failed(&call.id, failure),
        };
        let Some(child) = turn.agent.subagents.iter().find(|s| s.name == agent) else {
            let known: Vec<_> = turn
                .agent
                .subagents
                .iter()
                .map(|s| s.name.as_str())
                .collect();
            return failed(
                &call.id,
                Failure::new(
                    FailureKind::UnknownAgent,
                    format!(
                        "unknown subagent {agent:?}; available: {}",
                        known.join(", ")
                    ),
                ),
            );
        };
        let Some(pool) = catalog.pool_for_subagents() else {
            return failed(
                &call.id,
                Failure::new(FailureKind::Unavailable, "no live worker runs subagents"),
            );
        };
        let route = CallRoute {
            pool,
            timeout: self.settings.subagent_timeout,
            may_have_run: !turn.first_run,
        };
        self.dispatcher
            .call_subagent(
                &turn.origin,
                step,
                &call.id,
                child.clone(),
                task,
                turn.depth + 1,
                route,
            )
            .await
    }
}

/// Marks a span failed, with the failure's kind as `error.type`.
fn record_failure(span: &tracing::Span, failure: &Failure) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", failure.kind.as_str());
}

/// The messages of one model call: system prompt, prepared history, this turn so far.
fn conversation(system: &str, history: &[Message], turn_messages: &[Message]) -> Vec<Message> {
    let mut messages = Vec::with_capacity(1 + history.len() + turn_messages.len());
    messages.push(Message::system(system));
    messages.extend_from_slice(history);
    messages.extend_from_slice(turn_messages);
    messages
}

/// A turn that ends failed; a failure caused by cancellation is an interruption instead.
fn finished_failed(
    turn: &TurnInput<'_>,
    mut out: TurnOutput,
    failure: Failure,
) -> Result<TurnOutput, Interrupted> {
    interrupted_if_cancelled(turn)?;
    out.status = TurnStatus::Failed;
    out.failure = Some(failure);
    Ok(out)
}

fn interrupted_if_cancelled(turn: &TurnInput<'_>) -> Result<(), Interrupted> {
    if turn.cancel.is_cancelled() {
        Err(Interrupted(Failure::new(
            FailureKind::Cancelled,
            "turn cancelled",
        )))
    } else {
        Ok(())
    }
}

/// Whether a call ended because its task was cancelled.
fn stopped_by_cancel(result: &ToolResult) -> bool {
    matches!(&result.outcome, CallOutcome::Failed { failure } if failure.kind == FailureKind::Cancelled)
}

/// Records the turn so far, if the caller asked for checkpoints.
async fn checkpoint(turn: &TurnInput<'_>, out: &TurnOutput) -> Result<(), Interrupted> {
    let Some(checkpoints) = turn.checkpoints else {
        return Ok(());
    };
    let state = TurnCheckpoint {
        new_messages: out.new_messages.clone(),
        iterations: out.iterations,
        usage: out.usage,
    };
    checkpoints.save(&state).await.map_err(Interrupted)
}

/// Groups calls so that consecutive concurrency-safe calls run together and an unsafe call runs
/// alone, keeping the model's order.
fn concurrency_batches<'c>(calls: &'c [ToolCall], tools: &[ToolSpec]) -> Vec<&'c [ToolCall]> {
    let safe = |call: &ToolCall| {
        tools
            .iter()
            .find(|t| t.name == call.name)
            .is_none_or(|t| t.concurrency_safe)
    };
    let mut batches = Vec::new();
    let mut start = 0;
    for (i, call) in calls.iter().enumerate() {
        if !safe(call) {
            if start < i {
                batches.push(&calls[start..i]);
            }
            batches.push(&calls[i..=i]);
            start = i + 1;
        }
    }
    if start < calls.len() {
        batches.push(&calls[start..]);
    }
    batches
}

fn duplicate_call_id(calls: &[ToolCall]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    calls
        .iter()
        .map(|c| c.id.as_str())
        .find(|id| !seen.insert(*id))
}

fn spawn_tool_spec(subagents: &[AgentSpec]) -> ToolSpec {
    let names: Vec<_> = subagents.iter().map(|s| s.name.clone()).collect();
    ToolSpec {
        name: SPAWN_TOOL.into(),
        description: "Hand a self-contained subtask to a subagent and get its answer.".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "agent": { "type": "string", "enum": names, "description": "Which subagent runs the subtask." },
                "task": { "type": "string", "description": "The subtask, with everything the subagent needs to know." }
            },
            "required": ["agent", "task"],
            "additionalProperties": false
        }),
        concurrency_safe: true,
    }
}

fn parse_spawn_arguments(arguments: &Value) -> Result<(String, String), Failure> {
    let invalid = |message: &str| {
        Failure::new(
            FailureKind::InvalidArguments,
            format!("{SPAWN_TOOL}: {message}; expected {{\"agent\": string, \"task\": string}}"),
        )
    };
    let object = arguments
        .as_object()
        .ok_or_else(|| invalid("arguments are not an object"))?;
    if let Some(extra) = object.keys().find(|k| *k != "agent" && *k != "task") {
        return Err(invalid(&format!("unknown field {extra:?}")));
    }
    let field = |name: &str| {
        object
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| invalid(&format!("missing string field {name:?}")))
    };
    let task = field("task")?;
    if task.trim().is_empty() {
        return Err(invalid("task is empty"));
    }
    Ok((field("agent")?, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: json!({}),
        }
    }

    fn spec(name: &str, safe: bool) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({}),
            concurrency_safe: safe,
        }
    }

    #[test]
    fn unsafe_calls_run_alone_and_order_is_kept() {
        let tools = [spec("read", true), spec("write", false)];
        let calls = [
            call("1", "read"),
            call("2", "read"),
            call("3", "write"),
            call("4", "read"),
            call("5", "write"),
        ];
        let ids: Vec<Vec<&str>> = concurrency_batches(&calls, &tools)
            .iter()
            .map(|b| b.iter().map(|c| c.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["1", "2"], vec!["3"], vec!["4"], vec!["5"]]);
    }

    #[test]
    fn duplicate_call_ids_are_found() {
        assert_eq!(duplicate_call_id(&[call("1", "a"), call("2", "a")]), None);
        assert_eq!(
            duplicate_call_id(&[call("1", "a"), call("2", "b"), call("1", "c")]),
            Some("1")
        );
    }

    #[test]
    fn spawn_arguments_are_validated() {
        assert_eq!(
            parse_spawn_arguments(&json!({"agent": "r", "task": "t"})).expect("valid"),
            ("r".to_string(), "t".to_string())
        );
        for bad in [
            json!("r"),
            json!({"agent": "r"}),
            json!({"agent": 1, "task": "t"}),
            json!({"agent": "r", "task": "t", "x": 1}),
            json!({"agent": "r", "task": " "}),
        ] {
            let err = parse_spawn_arguments(&bad).expect_err("invalid");
            assert_eq!(err.kind, FailureKind::InvalidArguments, "{bad}");
        }
    }
}
