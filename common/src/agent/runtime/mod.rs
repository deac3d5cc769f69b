//! `Runtime`: the ReAct loop that runs one agent turn, the same code on the lead (user turns), on
//! workers (subagent turns) and in memory (embedders, tests).
//!
//! One turn: the turn hooks may rewrite the input or end the turn; the system prompt is assembled
//! from sections and passed through the prompt transformers; the model service is called with the
//! prepared history and the turn's tool snapshot (streaming deltas as events), wrapped in the
//! reasoning hooks; each tool call it asks for is decided by the permission policy, wrapped in the
//! acting hooks and sent to the tool service (independent calls in parallel, calls marked not
//! concurrency-safe one at a time, results back in the model's order); observe, repeat — until the
//! model answers or the iteration limit is reached, which ends with a summary answer.
//!
//! An agent with an output schema (a structured answer, see `agent::structured`) has every model
//! call of the turn carry the schema, and its answer — the model's last, or the summary — parsed
//! and checked: the turn ends with the answer's JSON text and its value (`output`). An answer
//! that fails is followed by `output_discarded` (its deltas are not the answer) and a repair
//! request, then the loop goes on (the repair is a model call like any other: an iteration, under
//! the iteration limit and the budget); a second answer that fails ends the turn
//! `invalid_output`. Only one repair per turn: one that a checkpoint carries counts when the turn
//! resumes. An answer a hook or an interrupt gives in the model's place is not checked, but one
//! `after_turn` hooks rewrite is checked again.
//!
//! The loop depends on no transport: it reaches everything through `seams`. It never panics on
//! model or tool misbehaviour: unknown tools, bad arguments, denied and failed calls become
//! observations the model can react to; a failed model call ends the turn with a failure as data.
//! A call that must wait for a person suspends the turn ([`TurnStop::AwaitingApproval`]): the
//! caller saves nothing new (the step's calls were checkpointed before they were decided) and
//! resumes the turn once the approval gate has an answer.

mod acting;
mod compact;
mod planning;
mod reasoning;
mod structured_answer;
mod turn;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::context::ContextLimits;
use crate::agent::middleware::hooks::{TurnContext, TurnSummary};
use crate::agent::middleware::{Middleware, ModelService, ToolService};
use crate::agent::model::ToolList;
use crate::agent::permissions::CompiledPolicy;
use crate::agent::prompt::{priority, SystemPrompt};
use crate::agent::seams::{
    ApprovalGate, CheckpointSink, ControlUpdate, EventSink, StepEnd, ToolDirectory, TurnCheckpoint,
    TurnControls,
};
use crate::agent::skills::SkillCatalog;
use crate::agent::structured::{is_repair_request, Structured};
use crate::protocol::message::{Message, Role, Usage};
use crate::protocol::{
    AgentSpec, EventKind, Failure, FailureKind, PendingCall, Plan, TaskOrigin, ToolSpec, TurnStatus,
};

pub use acting::{LOAD_SKILL_TOOL, REPLAYED, SPAWN_TOOL};
pub use compact::{Compaction, Summary};
pub use planning::{READ_PLAN_TOOL, RUN_PLAN_TOOL, UPDATE_PLAN_TOOL};
pub use turn::{Awaiting, TurnInput, TurnOutput, TurnStop};

use structured_answer::{invalid_output, recheck_rewritten, settle_answer, Settled};

/// Limits and defaults of a runtime.
#[derive(Debug, Clone)]
pub struct RuntimeSettings {
    /// Model used when an agent names none.
    pub default_model: String,
    /// The default model provider's kind, for telemetry (`openai`, `scripted`).
    pub provider: String,
    /// The kinds of the named providers (`SKEIN_PROVIDERS`), by name, for telemetry of calls of
    /// their models (`NAME:MODEL`).
    pub named_providers: Arc<BTreeMap<String, &'static str>>,
    pub tool_timeout: Duration,
    pub subagent_timeout: Duration,
    /// Deepest subagent nesting allowed (a user's agent is depth 0).
    pub max_depth: u32,
    pub context: ContextLimits,
    /// The caps a tool result's images are held to (past them the call's observation is a
    /// `too_large` failure).
    pub images: crate::protocol::ImageLimits,
}

impl RuntimeSettings {
    /// The kind of the provider a call of `model` goes to.
    pub fn provider_of(&self, model: &str) -> &str {
        model
            .split_once(crate::agent::model::providers::PROVIDER_SEPARATOR)
            .and_then(|(name, _)| self.named_providers.get(name).copied())
            .unwrap_or(&self.provider)
    }
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            default_model: "gpt-4o-mini".into(),
            provider: "openai".into(),
            named_providers: Arc::default(),
            tool_timeout: Duration::from_secs(60),
            subagent_timeout: Duration::from_secs(300),
            max_depth: crate::agent::definition::MAX_NESTING,
            context: ContextLimits::default(),
            images: crate::protocol::ImageLimits::default(),
        }
    }
}

/// Runs agent turns with one model service, one tool service and one tool directory, all wrapped
/// in the runtime's middleware.
pub struct Runtime {
    model: ModelService,
    tools: ToolService,
    directory: Arc<dyn ToolDirectory>,
    skills: SkillCatalog,
    middleware: Middleware,
    settings: RuntimeSettings,
    metrics: crate::metrics::Metrics,
    /// The runtime's own tool specs by what they are built from: built once, shared by turns.
    own_tools: std::sync::Mutex<std::collections::HashMap<String, Arc<[ToolSpec]>>>,
}

/// Most distinct sets of the runtime's own tools kept built; past it a turn builds its own.
const MAX_OWN_TOOL_SETS: usize = 64;

impl Runtime {
    /// A runtime over its seams; `middleware` wraps the model and tool services (its layers
    /// outside the built-ins) and brings the hooks and prompt transformers.
    pub fn new(
        model: ModelService,
        tools: ToolService,
        directory: Arc<dyn ToolDirectory>,
        skills: SkillCatalog,
        middleware: Middleware,
        settings: RuntimeSettings,
    ) -> Self {
        Self {
            model: middleware.wrap_model(model),
            tools: middleware.wrap_tools(tools),
            directory,
            skills,
            middleware,
            settings,
            metrics: crate::metrics::Metrics::new(),
            own_tools: Default::default(),
        }
    }

    /// Counts model calls into `metrics` (the process's registry) instead of a private one.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn skills(&self) -> &SkillCatalog {
        &self.skills
    }

    /// Runs one turn to its end, or resumes it from `turn.resume`. `Err` means the turn stopped
    /// without ending (interrupted, or waiting for approval): the caller decides what happens
    /// next.
    ///
    /// A plain function: an `async fn` would keep the turn's input twice in its future, and
    /// the layers below borrow it rather than take it, for the same reason.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would store the turn's input twice in its future"
    )]
    pub fn run_turn<'a>(
        &'a self,
        mut turn: TurnInput<'a>,
    ) -> impl std::future::Future<Output = Result<TurnOutput, TurnStop>> + Send + 'a {
        async move {
            let span = tracing::info_span!(
                "invoke_agent",
                "otel.name" = format!("invoke_agent {}", turn.agent.name),
                "gen_ai.operation.name" = "invoke_agent",
                "gen_ai.agent.name" = %turn.agent.name,
                "gen_ai.conversation.id" = %turn.origin.session,
                "skein.task_id" = %turn.origin.task_id,
                "skein.tenant" = %turn.origin.tenant,
                "skein.depth" = turn.depth,
                "skein.approval_pending" = tracing::field::Empty,
                "otel.status_code" = tracing::field::Empty,
                "error.type" = tracing::field::Empty,
            );
            let result = self
                .run_hooked_turn(&mut turn)
                .instrument(span.clone())
                .await;
            match &result {
                Ok(TurnOutput {
                    failure: Some(failure),
                    ..
                })
                | Err(TurnStop::Interrupted(failure)) => record_failure(&span, failure),
                Err(TurnStop::AwaitingApproval(awaiting)) => {
                    span.record("skein.approval_pending", awaiting.calls.len());
                }
                Err(TurnStop::Paused) | Ok(_) => {}
            }
            result
        }
    }

    /// The turn inside its turn hooks: `before_turn` may rewrite the input or end the turn
    /// without a model call; `after_turn` may change how it ended.
    async fn run_hooked_turn(&self, turn: &mut TurnInput<'_>) -> Result<TurnOutput, TurnStop> {
        if self.middleware.hooks().is_empty() {
            return self.run_turn_steps(turn).await;
        }
        // Boxed: only a turn with hooks keeps their context, and inline it would grow the
        // future of every turn.
        Box::pin(self.run_turn_in_hooks(turn)).await
    }

    /// [`Runtime::run_hooked_turn`] for a runtime with turn hooks.
    async fn run_turn_in_hooks(&self, turn: &mut TurnInput<'_>) -> Result<TurnOutput, TurnStop> {
        let hooks = self.middleware.hooks();
        let ctx = turn_context(turn, 0);
        // A resumed turn already went through `before_turn` on its first run.
        if turn.resume.is_none() {
            match hooks.enter_turn(&ctx, turn.input.clone()).await {
                Ok(input) => turn.input = input,
                Err(summary) => {
                    // A hook ended the turn (its outer hooks' `after_turn` already ran).
                    let mut out =
                        TurnOutput::started(turn.input.clone(), turn.input_images.clone());
                    if let Some(answer) = &summary.answer {
                        out.new_messages.push(Message::assistant(answer.clone()));
                    }
                    if summary.failure.is_some() {
                        out.status = TurnStatus::Failed;
                    }
                    out.answer = summary.answer;
                    out.failure = summary.failure;
                    return Ok(out);
                }
            }
        }
        let agent = turn.agent;
        let out = self.run_turn_steps(turn).await?;
        Ok(self.after_turn(&ctx, agent, out).await)
    }

    async fn after_turn(
        &self,
        ctx: &TurnContext,
        agent: &AgentSpec,
        mut out: TurnOutput,
    ) -> TurnOutput {
        // A structured answer the hooks rewrite is checked again.
        let checked = out.output.is_some().then(|| out.answer.clone()).flatten();
        let summary = TurnSummary {
            answer: out.answer.take(),
            failure: out.failure.take(),
        };
        let summary = self.middleware.hooks().exit_turn(ctx, summary).await;
        // The session keeps the answer as the hooks left it.
        if let (Some(answer), Some(last)) = (&summary.answer, out.new_messages.last_mut()) {
            if last.role == Role::Assistant && last.tool_calls.is_empty() {
                last.content.clone_from(answer);
            }
        }
        out.status = match (&summary.failure, out.status) {
            (Some(_), TurnStatus::Completed) => TurnStatus::Failed,
            (None, TurnStatus::Failed) if summary.answer.is_some() => TurnStatus::Completed,
            (_, status) => status,
        };
        out.answer = summary.answer;
        out.failure = summary.failure;
        if checked.is_some() && out.answer != checked {
            recheck_rewritten(agent, &mut out);
        }
        out
    }

    async fn run_turn_steps(&self, turn: &TurnInput<'_>) -> Result<TurnOutput, TurnStop> {
        let asked = std::sync::atomic::AtomicBool::new(false);
        let mut out = self.steps(turn, &asked).await?;
        out.asked_approval = asked.load(std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    async fn steps(
        &self,
        turn: &TurnInput<'_>,
        asked: &std::sync::atomic::AtomicBool,
    ) -> Result<TurnOutput, TurnStop> {
        let mut out = TurnOutput::started(turn.input.clone(), turn.input_images.clone());
        out.plan = turn.plan.cloned();
        if let Some(resumed) = turn.resume.clone() {
            out.new_messages = resumed.new_messages;
            out.iterations = resumed.iterations;
            out.usage = resumed.usage;
            out.loaded_skills = resumed.loaded_skills;
            out.compaction = resumed.compaction;
            out.plan = resumed.plan.or(out.plan);
            out.steered = resumed.steered;
            out.step_ends = resumed.step_ends;
        }
        // Without the tool catalog the turn cannot know what its model may call: it stops, to
        // run again, rather than answer with no tools.
        let catalog = self
            .directory
            .current()
            .await
            .map_err(TurnStop::Interrupted)?;
        let policy = match CompiledPolicy::compile(&turn.agent.permissions) {
            Ok(policy) => policy,
            Err(e) => {
                let failure = Failure::new(FailureKind::InvalidInput, e.to_string());
                return finished_failed(turn, out, failure);
            }
        };
        let structured = match Structured::of(turn.agent) {
            Ok(structured) => structured,
            Err(failure) => return finished_failed(turn, out, failure),
        };
        let output_schema = structured.as_ref().map(|s| s.schema.clone());
        let tools = {
            let (key, extras) = self.runtime_tools(turn);
            catalog.tools_for(&turn.agent.tools, &key, &extras)
        };
        let model = self.model_name(turn);
        // What a request is sized by: its tools and, as one more, the output schema (measured
        // once: a shared list comes measured).
        let sized_tools = match &structured {
            Some(s) => ToolList::from(
                tools
                    .iter()
                    .cloned()
                    .chain(std::iter::once(ToolSpec {
                        name: s.schema.name.clone(),
                        description: s.schema.description.clone(),
                        parameters: s.schema.schema.clone(),
                        concurrency_safe: true,
                        effects: Default::default(),
                    }))
                    .collect::<Vec<_>>(),
            ),
            None => tools.clone(),
        };
        let tools_bytes = sized_tools.upper_bound();
        let mut window = compact::Window::new(turn, &out, self);
        let max_messages = self.settings.context.max_history_messages;
        let board = planning::PlanBoard::new(out.plan.clone());
        let acting = acting::Acting {
            runtime: self,
            turn,
            catalog: &catalog,
            tools: &tools,
            policy: &policy,
            asked,
            board: &board,
        };

        // Steer messages and an interrupt seen at a step boundary, applied before the next model
        // call (a user message cannot come between calls and their results).
        let mut asked = ControlUpdate::default();
        loop {
            interrupted_if_cancelled(turn)?;
            if let Some(controls) = turn.controls {
                match controls.changed(out.steered).await {
                    Ok(Some(update)) if update.paused => return Err(TurnStop::Paused),
                    Ok(Some(update)) => asked = update,
                    Ok(None) => {}
                    Err(failure) => return Err(TurnStop::Interrupted(failure)),
                }
            }
            match out.new_messages.last() {
                // Calls asked for but not yet observed (also when resuming after a crash or an
                // approval): run them. Calls already recorded are not run again: the tool
                // service returns their recorded results.
                Some(last) if last.role == Role::Assistant && !last.tool_calls.is_empty() => {
                    let calls = last.tool_calls.clone();
                    let observed = acting.execute_calls(out.iterations, &calls).await?;
                    interrupted_if_cancelled(turn)?;
                    out.plan = board.current();
                    for (call, observation) in calls.iter().zip(observed) {
                        if let Some(skill) = observation.loaded_skill {
                            if !out.loaded_skills.contains(&skill) {
                                out.loaded_skills.push(skill);
                            }
                        }
                        out.new_messages.push(
                            Message::tool_result(&call.id, observation.text)
                                .with_images(observation.images),
                        );
                    }
                    // Again after a resume (the step's calls answered from their records): the
                    // later time, after every write the step made.
                    out.step_ends.retain(|end| end.step != out.iterations);
                    out.step_ends.push(StepEnd {
                        step: out.iterations,
                        at_ms: crate::protocol::now_ms(),
                    });
                    // No checkpoint here: the results are recorded by call key, so a turn that
                    // resumes from the checkpoint of these calls gets them back without running
                    // them again; the next step's checkpoint carries them.
                    continue;
                }
                // An answer: the turn ends, once a structured answer matches its schema.
                Some(last) if last.role == Role::Assistant => {
                    let text = last.content.clone();
                    match settle_answer(turn, &mut out, structured.as_ref(), text).await {
                        Settled::Ended => return Ok(out),
                        Settled::Failed(problems, text) => {
                            return invalid_output(turn, out, structured.as_ref(), &problems, text)
                        }
                        // Asked to repair it: the loop makes the call.
                        Settled::Repair => {}
                    }
                }
                _ => {}
            }
            if let Some(by) = asked.interrupted_by.take() {
                let answer = interrupted_answer(&by);
                out.new_messages.push(Message::assistant(answer.clone()));
                out.answer = Some(answer);
                return Ok(out);
            }
            for text in std::mem::take(&mut asked.steer) {
                turn.events
                    .emit(EventKind::Steered { text: text.clone() })
                    .await;
                out.new_messages.push(Message::user(text));
                out.steered += 1;
            }
            if out.iterations >= turn.agent.max_iterations {
                break;
            }
            let mut overflowed = false;
            let response = loop {
                let system = self.system_prompt(turn, &out, window.summary.as_ref());
                let request = compact::Request {
                    model: &model,
                    system: &system,
                    tools: &sized_tools,
                    tools_bytes,
                };
                let compacted = match self
                    .fit(turn, &mut window, &mut out, &request, overflowed)
                    .await
                {
                    Ok(compacted) => compacted,
                    Err(failure) => return finished_failed(turn, out, failure),
                };
                if overflowed && compacted.is_none() {
                    let failure = Failure::new(
                        FailureKind::ContextOverflow,
                        "the request is longer than the model's context, and compacting the \
                         history could not shorten it",
                    );
                    return finished_failed(turn, out, failure);
                }
                // The prompt with the new summaries, when the history or the turn was compacted.
                let system = compacted.unwrap_or(system);
                let messages = window.conversation(&system, &out, max_messages);
                match self
                    .model_call(
                        turn,
                        out.iterations,
                        messages,
                        tools.clone(),
                        output_schema.clone(),
                    )
                    .await
                {
                    Ok(response) => break response,
                    // A model that refuses the request as too long gets it once more, compacted.
                    Err(failure) if failure.kind == FailureKind::ContextOverflow && !overflowed => {
                        overflowed = true;
                    }
                    Err(failure) => return finished_failed(turn, out, failure),
                }
            };
            out.iterations += 1;
            settle_step_end(&mut out);
            out.usage.add(response.usage);
            let asks_for_tools = !response.message.tool_calls.is_empty();
            out.new_messages.push(response.message);
            // Calls are checkpointed before they are decided and dispatched, so a resumed turn
            // (after a crash or an approval) runs the same calls (whose results are recorded)
            // rather than asking the model again. An answer is not: the turn ends next,
            // atomically with its final result, and a turn resumed before that asks the model
            // once more.
            if asks_for_tools {
                checkpoint(turn, &out).await?;
            }
        }

        // Iteration limit: one more call, without tools, for a summary answer (and, for a
        // structured answer that fails, its repair, if the turn has not had one).
        out.limit_reached = true;
        loop {
            let system = self.system_prompt(turn, &out, window.summary.as_ref());
            let mut messages = window.conversation(&system, &out, max_messages);
            let format = if structured.is_some() {
                " Give it in the required JSON format."
            } else {
                ""
            };
            messages.push(Message::system(format!(
                "You have used all {} steps allowed for this turn. Do not call tools. Answer now: \
                 summarise what you found and what is left to do.{format}",
                turn.agent.max_iterations
            )));
            let response = match self
                .model_call(
                    turn,
                    out.iterations,
                    messages,
                    ToolList::default(),
                    output_schema.clone(),
                )
                .await
            {
                Ok(response) => response,
                Err(failure) => return finished_failed(turn, out, failure),
            };
            out.iterations += 1;
            settle_step_end(&mut out);
            out.usage.add(response.usage);
            let mut message = response.message;
            message.tool_calls.clear();
            let text = message.content.clone();
            out.new_messages.push(message);
            match settle_answer(turn, &mut out, structured.as_ref(), text).await {
                Settled::Ended => return Ok(out),
                Settled::Failed(problems, text) => {
                    return invalid_output(turn, out, structured.as_ref(), &problems, text)
                }
                Settled::Repair => {}
            }
        }
    }

    /// The runtime's own tools this turn offers — `spawn_agent` when the agent has subagents and
    /// may nest deeper, the plan tools when it plans, `load_skill` when it may load skills — and
    /// the key naming them (what they are built from). Built once per key and shared.
    fn runtime_tools(&self, turn: &TurnInput<'_>) -> (String, Arc<[ToolSpec]>) {
        let may_spawn = !turn.agent.subagents.is_empty() && turn.depth < self.settings.max_depth;
        let skills = turn.skills.unwrap_or(&self.skills);
        let skills = skills.allowed(turn.agent.skills.as_deref());
        let subagents: Vec<&str> = turn
            .agent
            .subagents
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        let key = format!(
            "{may_spawn}|{}|{}|{}",
            turn.agent.planning,
            subagents.join(","),
            skills.join(",")
        );
        if let Some(built) = self
            .own_tools
            .lock()
            .ok()
            .and_then(|b| b.get(&key).cloned())
        {
            return (key, built);
        }
        let mut extras = Vec::new();
        if may_spawn {
            extras.push(acting::spawn_tool_spec(&turn.agent.subagents));
        }
        extras.extend(planning::plan_tool_specs(turn.agent, may_spawn));
        if !skills.is_empty() {
            extras.push(acting::load_skill_spec(&skills));
        }
        let built: Arc<[ToolSpec]> = extras.into();
        if let Ok(mut kept) = self.own_tools.lock() {
            if kept.len() < MAX_OWN_TOOL_SETS {
                kept.insert(key.clone(), built.clone());
            }
        }
        (key, built)
    }

    fn system_prompt(
        &self,
        turn: &TurnInput<'_>,
        out: &TurnOutput,
        summary: Option<&Summary>,
    ) -> String {
        let loaded_this_turn = &out.loaded_skills;
        let mut prompt = SystemPrompt::default();
        prompt.add("agent", priority::AGENT, turn.agent.system_prompt.clone());
        if let Some(summary) = summary {
            prompt.add(
                "summary",
                priority::SUMMARY,
                crate::agent::compaction::summary_section(&summary.text, summary.messages),
            );
        }
        if let Some(steps) = compact::steps_summary(out) {
            prompt.add(
                "turn_summary",
                priority::SUMMARY + 1,
                crate::agent::compaction::steps_section(&steps.text, steps.messages),
            );
        }
        if !turn.agent.subagents.is_empty() && turn.depth < self.settings.max_depth {
            let mut roster =
                format!("You can hand subtasks to these agents with the {SPAWN_TOOL} tool:\n");
            for sub in &turn.agent.subagents {
                for part in ["- ", &sub.name, ": ", &sub.description, "\n"] {
                    roster.push_str(part);
                }
            }
            prompt.add("subagents", priority::SUBAGENTS, roster);
        }
        if let Some(plan) = out.plan.as_ref().filter(|_| turn.agent.planning) {
            prompt.add(
                "plan",
                priority::PLAN,
                format!(
                    "Your plan so far ({READ_PLAN_TOOL} shows the steps' outcomes):\n{}",
                    crate::agent::plan::checklist(plan)
                ),
            );
        }
        let allowed = turn.agent.skills.as_deref();
        let skills = turn.skills.unwrap_or(&self.skills);
        if let Some(catalog) = skills.prompt_section(allowed) {
            prompt.add("skills", priority::SKILLS, catalog);
        }
        let loaded: Vec<&str> = turn
            .loaded_skills
            .iter()
            .chain(loaded_this_turn)
            .map(String::as_str)
            .collect();
        if let Some(bodies) = skills.loaded_section(&loaded, allowed) {
            prompt.add("loaded_skills", priority::SKILLS + 1, bodies);
        }
        prompt.add(
            "context",
            priority::CONTEXT,
            crate::text::joined(&[
                "Session ",
                &turn.origin.session,
                " of tenant ",
                &turn.origin.tenant,
                ". Files you write persist in the workspace of session ",
                &turn.origin.workspace,
                ".",
            ]),
        );
        self.middleware.prompt().apply(turn.agent, prompt.render())
    }
}

/// The answer of a turn a later task of its session interrupted (`multitask: interrupt`).
pub fn interrupted_answer(by: &str) -> String {
    format!(
        "[interrupted by task {by}: this turn stopped before its next step; its work so far is kept]"
    )
}

/// The hooks' view of a turn at a step.
fn turn_context(turn: &TurnInput<'_>, step: u32) -> TurnContext {
    TurnContext {
        origin: turn.origin.clone(),
        agent: turn.agent.name.clone(),
        depth: turn.depth,
        step,
    }
}

/// Marks a span failed, with the failure's kind as `error.type`.
pub(crate) fn record_failure(span: &tracing::Span, failure: &Failure) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", failure.kind.as_str());
}

/// A turn that ends failed; a failure caused by cancellation is an interruption instead. A
/// model call refused by a budget ends the turn `budget_exhausted`, with an answer (also kept
/// as the turn's last message) that says what was spent.
fn finished_failed(
    turn: &TurnInput<'_>,
    mut out: TurnOutput,
    failure: Failure,
) -> Result<TurnOutput, TurnStop> {
    interrupted_if_cancelled(turn)?;
    out.status = TurnStatus::Failed;
    if failure.kind == FailureKind::BudgetExhausted {
        let answer = format!("Stopped before finishing: {}.", failure.message);
        out.status = TurnStatus::BudgetExhausted;
        out.new_messages.push(Message::assistant(answer.clone()));
        out.answer = Some(answer);
    }
    out.failure = Some(failure);
    Ok(out)
}

fn interrupted_if_cancelled(turn: &TurnInput<'_>) -> Result<(), TurnStop> {
    if turn.cancel.is_cancelled() {
        Err(TurnStop::cancelled())
    } else {
        Ok(())
    }
}

/// Puts the end of the step before the model response just received halfway between its calls'
/// last answer and this response: the workers that wrote files for that step and for the next
/// stamp them with their own clocks, and the middle leaves half a model call of slack each way.
fn settle_step_end(out: &mut TurnOutput) {
    let previous = out.iterations.saturating_sub(1);
    if let Some(end) = out.step_ends.last_mut().filter(|end| end.step == previous) {
        let now = crate::protocol::now_ms();
        end.at_ms = end.at_ms + now.saturating_sub(end.at_ms) / 2;
    }
}

/// Records the turn so far, if the caller asked for checkpoints.
async fn checkpoint(turn: &TurnInput<'_>, out: &TurnOutput) -> Result<(), TurnStop> {
    let Some(checkpoints) = turn.checkpoints else {
        return Ok(());
    };
    let state = TurnCheckpoint {
        new_messages: out.new_messages.clone(),
        iterations: out.iterations,
        usage: out.usage,
        loaded_skills: out.loaded_skills.clone(),
        compaction: out.compaction.clone(),
        plan: out.plan.clone(),
        steered: out.steered,
        step_ends: out.step_ends.clone(),
    };
    checkpoints
        .save(&state)
        .await
        .map_err(TurnStop::Interrupted)
}
