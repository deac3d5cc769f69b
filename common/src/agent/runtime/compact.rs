//! The turn's view of its session's history and of its own steps, and compacting them: before
//! each model call the runtime asks whether the request fits the agent's context. When it does
//! not, the older history is summarised by the model (`compaction::plan`, a `compact_history`
//! span with its own `chat` call, and a `compacted` event) and the turn goes on with the summary
//! in its system prompt and only the recent turns verbatim. When the turn's own steps still do not
//! fit, its older steps are summarised the same way (`compaction::plan_steps`, a `compact_turn`
//! span): the model then sees the turn's input, the summary of its older steps (in the system
//! prompt) and its latest steps verbatim, never a result without its call. A request that cannot
//! fit even so fails the turn `context_overflow`, saying what is too large.
//!
//! The turn reports what it compacted ([`TurnOutput::compaction`]) and checkpoints it, so a
//! resumed turn neither summarises again nor sends again what a summary stands for. The caller
//! stores the history's summary with the session; the summary of the turn's steps stays with the
//! turn (its messages are stored whole, [`TurnOutput::new_messages`]). Every summary call goes
//! through the model service and its middleware, so budgets and limits see it.

use serde::{Deserialize, Serialize};
use tower::ServiceExt;
use tracing::Instrument;

use super::{Runtime, TurnInput, TurnOutput};
use crate::agent::compaction::{self, Floor, Plan, RequestSize, StepsPlan, Trigger};
use crate::agent::context;
use crate::agent::model::{ModelRequest, ToolList};
use crate::agent::seams::{failure_from_error, ModelCall};
use crate::agent::tokens::{self, TokenCounter};
use crate::protocol::message::{Message, Usage};
use crate::protocol::{EventKind, Failure, FailureKind, ToolSpec};

/// A summary of compacted messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub text: String,
    /// How many messages it stands for: of the session (earlier summaries' included) for the
    /// session's summary, of the turn after its input for the summary of a turn's steps.
    pub messages: u64,
}

/// What a turn compacted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The session's new summary, standing for the first `compacted` messages of the history the
    /// turn was given (they stay stored); `None` when the turn compacted only its own steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    #[serde(default)]
    pub compacted: usize,
    /// The summary of the turn's own earlier steps: it stands for the turn's `messages` messages
    /// after its input, which its requests no longer carry. The turn's messages stay whole, and
    /// the session does not store this summary. Boxed: every checkpoint carries the field, and
    /// checkpoints move whole inside enums (`ChildProgress`); a turn seldom needs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Box<Summary>>,
}

/// The summary of the turn's earlier steps, when it compacted them.
pub(super) fn steps_summary(out: &TurnOutput) -> Option<&Summary> {
    out.compaction.as_ref().and_then(|c| c.steps.as_deref())
}

/// Where the turn's messages the model still sees verbatim start, after its input: past what the
/// summary of its steps stands for.
fn steps_from(out: &TurnOutput) -> usize {
    let summarised =
        steps_summary(out).map_or(0, |s| usize::try_from(s.messages).unwrap_or(usize::MAX));
    summarised.saturating_add(1).min(out.new_messages.len())
}

/// The turn as its requests carry it: its input, then the messages no summary stands for.
fn turn_view(out: &TurnOutput) -> (&[Message], &[Message]) {
    let turn = &out.new_messages;
    let from = steps_from(out);
    (&turn[..from.min(1)], &turn[from..])
}

/// The history a turn's model calls see: what is left after compaction, huge old tool results
/// evicted, and the summary standing for the rest.
pub(super) struct Window<'t> {
    full: &'t [Message],
    compacted: usize,
    pub(super) summary: Option<Summary>,
    pub(super) messages: Vec<Message>,
    bytes: u64,
    /// The tokens of each of `messages`, once counted: a turn's model (so its counter) and
    /// history do not change, so they are counted once, not at every step.
    counts: Option<Vec<u64>>,
    /// The tokens of the turn's tool specs, once counted.
    tools_tokens: Option<u64>,
    /// The tokens of each of the turn's messages counted so far: a turn only appends messages,
    /// so each is counted once.
    turn_counts: Vec<u64>,
}

impl<'t> Window<'t> {
    pub(super) fn new(turn: &TurnInput<'t>, out: &TurnOutput, runtime: &Runtime) -> Self {
        let mut window = Window {
            full: turn.history,
            compacted: 0,
            summary: turn.summary.cloned(),
            messages: Vec::new(),
            bytes: 0,
            counts: None,
            tools_tokens: None,
            turn_counts: Vec::new(),
        };
        match out.compaction.as_ref().and_then(|done| {
            done.summary
                .as_ref()
                .map(|summary| (done.compacted, summary.clone()))
        }) {
            Some((compacted, summary)) => window.cut(compacted, Some(summary), runtime),
            None => window.cut(0, window.summary.clone(), runtime),
        }
        window
    }

    /// Keeps `full[compacted..]` (evicted), with `summary` standing for the rest.
    fn cut(&mut self, compacted: usize, summary: Option<Summary>, runtime: &Runtime) {
        let compacted = compacted.min(self.full.len());
        self.compacted = compacted;
        self.summary = summary;
        self.messages = context::evict(
            &self.full[compacted..],
            runtime.settings.context.max_old_tool_result_bytes,
        );
        self.bytes = tokens::upper_bound(&self.messages);
        self.counts = None;
    }

    /// Leaves out the window's first `n` messages (just summarised by `summary`); what is left,
    /// and its counts, stay as they are.
    fn drop_front(&mut self, n: usize, summary: Summary) {
        let n = n.min(self.messages.len());
        self.messages.drain(..n);
        if let Some(counts) = &mut self.counts {
            counts.drain(..n.min(counts.len()));
        }
        self.compacted += n;
        self.summary = Some(summary);
        self.bytes = tokens::upper_bound(&self.messages);
    }

    /// The history to send: the window, cut further at a turn's start if it still holds more
    /// messages than allowed (only when compacting failed).
    pub(super) fn visible(&self, max_messages: usize) -> &[Message] {
        &self.messages[context::trim_start(&self.messages, max_messages)..]
    }

    /// The messages of one model call: the system prompt, the visible history, and the turn as
    /// its requests carry it (its input, then its steps no summary stands for).
    pub(super) fn conversation(
        &self,
        system: &str,
        out: &TurnOutput,
        max_messages: usize,
    ) -> Vec<Message> {
        let history = self.visible(max_messages);
        let (input, steps) = turn_view(out);
        let mut messages = Vec::with_capacity(1 + history.len() + input.len() + steps.len());
        messages.push(Message::system(system));
        messages.extend_from_slice(history);
        messages.extend_from_slice(input);
        messages.extend_from_slice(steps);
        messages
    }

    /// The tokens of the window's history.
    fn history_tokens(&mut self, counter: &TokenCounter) -> u64 {
        let messages = &self.messages;
        self.counts
            .get_or_insert_with(|| compaction::counts(messages, counter))
            .iter()
            .sum()
    }
}

/// The tokens of `tools`, counted once a turn into `cached`.
fn tools_tokens(cached: &mut Option<u64>, counter: &TokenCounter, tools: &[ToolSpec]) -> u64 {
    *cached.get_or_insert_with(|| counter.tools(tools))
}

/// The tokens of each of the turn's messages, counting only those `cached` does not hold yet.
fn turn_counts<'c>(
    cached: &'c mut Vec<u64>,
    turn: &[Message],
    counter: &TokenCounter,
) -> &'c [u64] {
    if cached.len() > turn.len() {
        cached.clear();
    }
    let counted = cached.len();
    cached.extend(turn[counted..].iter().map(|m| counter.message(m)));
    cached
}

/// The tokens of the turn as its requests carry it (see [`turn_view`]), from the tokens of each
/// of its messages and where its unsummarised steps start.
fn view_tokens(counts: &[u64], from: usize) -> u64 {
    counts[..from.min(1)].iter().sum::<u64>() + counts[from..].iter().sum::<u64>()
}

/// What one request is made of, for deciding whether it fits.
#[derive(Clone, Copy)]
pub(super) struct Request<'a> {
    pub model: &'a str,
    pub system: &'a str,
    pub tools: &'a [ToolSpec],
    pub tools_bytes: u64,
}

impl Runtime {
    /// The agent's context size for `model`.
    pub(super) fn context_tokens(&self, turn: &TurnInput<'_>, model: &str) -> u64 {
        turn.agent.context_tokens.unwrap_or_else(|| {
            tokens::default_context_tokens(model, self.settings.context.default_context_tokens)
        })
    }

    /// Compacts what the next request carries when `request` would not fit (or, `overflowed`,
    /// when the model said it did not): first the window's history, then the turn's own older
    /// steps. Returns the system prompt with the new summaries when it compacted. A summary that
    /// cannot be made is logged and the turn goes on without it (the history's oldest messages
    /// trimmed instead), unless the turn was cancelled or its budget refused the call (the
    /// turn's next call would be refused too). A request that cannot fit with everything
    /// compacted that can be fails `context_overflow`.
    pub(super) async fn fit(
        &self,
        turn: &TurnInput<'_>,
        window: &mut Window<'_>,
        out: &mut TurnOutput,
        request: &Request<'_>,
        overflowed: bool,
    ) -> Result<Option<String>, Failure> {
        let history = self
            .fit_history(turn, window, out, request, overflowed)
            .await?;
        let request = Request {
            system: history.as_deref().unwrap_or(request.system),
            ..*request
        };
        let steps = self
            .fit_steps(turn, window, out, &request, overflowed, history.is_some())
            .await?;
        Ok(steps.or(history))
    }

    /// Compacts the window's history when `request` would not fit (see [`Runtime::fit`]).
    async fn fit_history(
        &self,
        turn: &TurnInput<'_>,
        window: &mut Window<'_>,
        out: &mut TurnOutput,
        request: &Request<'_>,
        overflowed: bool,
    ) -> Result<Option<String>, Failure> {
        let limits = &self.settings.context;
        let context_tokens = self.context_tokens(turn, request.model);
        let counter = TokenCounter::for_model(request.model);
        let summary_section = window
            .summary
            .as_ref()
            .map_or(0, |s| s.text.len() as u64 + 200);
        let (input, steps) = turn_view(out);
        let size = RequestSize {
            other_bytes: compaction::other_bytes(
                request.system,
                request.tools_bytes,
                tokens::upper_bound(input) + tokens::upper_bound(steps),
            ) + summary_section,
            history_bytes: window.bytes,
        };
        let (cached_tools, cached_turn) = (&mut window.tools_tokens, &mut window.turn_counts);
        let turn_messages = &out.new_messages;
        let from = steps_from(out);
        let count_other = || {
            let counts = turn_counts(cached_turn, turn_messages, &counter);
            counter.text(request.system)
                + tools_tokens(cached_tools, &counter, request.tools)
                + view_tokens(counts, from)
        };
        let (messages, counts) = (&window.messages, &mut window.counts);
        let count_history = move || -> &[u64] {
            let counts = counts;
            counts.get_or_insert_with(|| compaction::counts(messages, &counter))
        };
        let Some(plan) = compaction::plan(
            &window.messages,
            size,
            count_other,
            count_history,
            context_tokens,
            limits,
            overflowed,
        ) else {
            return Ok(None);
        };
        // Boxed, as the other summary below: a summary is a model call, rare, and inline its
        // future would be held by every turn for the whole of each step.
        match Box::pin(self.summarise_history(turn, window, &plan, request.model, context_tokens))
            .await
        {
            Ok((summary, usage)) => {
                out.usage.add(usage);
                window.drop_front(plan.cut, summary.clone());
                let steps = out.compaction.take().and_then(|c| c.steps);
                out.compaction = Some(Compaction {
                    summary: Some(summary),
                    compacted: window.compacted,
                    steps,
                });
                // Counted as the next request goes out: the new summary in the system prompt
                // (in place of the one it folded in), the history left.
                let system = self.system_prompt(turn, out, window.summary.as_ref());
                let history_tokens = window.history_tokens(&counter);
                let tools_tokens = tools_tokens(&mut window.tools_tokens, &counter, request.tools);
                let from = steps_from(out);
                let counts = turn_counts(&mut window.turn_counts, &out.new_messages, &counter);
                let tokens_after = counter.text(&system)
                    + tools_tokens
                    + view_tokens(counts, from)
                    + history_tokens;
                emit_compacted(
                    turn,
                    plan.cut,
                    plan.trigger,
                    plan.tokens_before,
                    tokens_after,
                )
                .await;
                Ok(Some(system))
            }
            Err(failure) => {
                go_on_without(
                    failure,
                    plan.trigger,
                    "the history could not be summarised; the oldest messages are left out instead",
                )?;
                Ok(None)
            }
        }
    }

    /// Compacts the turn's own older steps when `request` (its history already compacted as far
    /// as it goes) would still not fit; fails the turn when the model refused a request whose
    /// latest step alone cannot fit.
    /// `history_compacted`: the history was compacted for this very request.
    async fn fit_steps(
        &self,
        turn: &TurnInput<'_>,
        window: &mut Window<'_>,
        out: &mut TurnOutput,
        request: &Request<'_>,
        overflowed: bool,
        history_compacted: bool,
    ) -> Result<Option<String>, Failure> {
        let limits = &self.settings.context;
        let context_tokens = self.context_tokens(turn, request.model);
        let threshold = context_tokens.saturating_mul(u64::from(limits.compact_at_percent)) / 100;
        let (input, steps) = turn_view(out);
        let bytes = compaction::other_bytes(
            request.system,
            request.tools_bytes,
            tokens::upper_bound(input) + tokens::upper_bound(steps),
        ) + window.bytes;
        if !overflowed && bytes <= threshold {
            return Ok(None);
        }
        let counter = TokenCounter::for_model(request.model);
        let fixed = counter.text(request.system)
            + tools_tokens(&mut window.tools_tokens, &counter, request.tools);
        let history = window.history_tokens(&counter);
        let from = steps_from(out);
        let counts = turn_counts(&mut window.turn_counts, &out.new_messages, &counter);
        let latest = compaction::latest_step(&out.new_messages, from);
        // The least the request can be: everything but the history (a summary stands for it) and
        // the turn's earlier steps.
        let floor = Floor {
            fixed,
            input: counts[..from.min(1)].iter().sum(),
            latest: latest.map_or(0, |l| counts[l..].iter().sum()),
        };
        let refuse = |refused| {
            Failure::new(
                FailureKind::ContextOverflow,
                compaction::overflow_reason(
                    &out.new_messages,
                    latest,
                    floor,
                    context_tokens,
                    refused,
                ),
            )
        };
        if floor.total() > context_tokens {
            // A count is an estimate (a model's own tool-call arguments, say, may be large and
            // still fit): only a model that refused the request ends the turn here.
            if overflowed {
                return Err(refuse(false));
            }
            return Ok(None);
        }
        let Some(plan) = compaction::plan_steps(
            &out.new_messages,
            from,
            counts,
            fixed + history + floor.input,
            context_tokens,
            limits,
            overflowed,
        ) else {
            // The model refused a request nothing more can be taken out of: sending it again
            // would be refused again.
            if overflowed && !history_compacted && window.messages.is_empty() {
                return Err(refuse(true));
            }
            return Ok(None);
        };
        let kept: u64 = counts[plan.cut..].iter().sum();
        match Box::pin(self.summarise_steps(turn, out, &plan, request.model, context_tokens)).await
        {
            Ok((text, usage)) => {
                out.usage.add(usage);
                let steps = Box::new(Summary {
                    text,
                    messages: plan.cut as u64 - 1,
                });
                match &mut out.compaction {
                    Some(compaction) => compaction.steps = Some(steps),
                    None => {
                        out.compaction = Some(Compaction {
                            summary: None,
                            compacted: 0,
                            steps: Some(steps),
                        })
                    }
                }
                let system = self.system_prompt(turn, out, window.summary.as_ref());
                let tokens_after = counter.text(&system)
                    + tools_tokens(&mut window.tools_tokens, &counter, request.tools)
                    + history
                    + floor.input
                    + kept;
                emit_compacted(
                    turn,
                    plan.cut - plan.from,
                    plan.trigger,
                    plan.tokens_before,
                    tokens_after,
                )
                .await;
                Ok(Some(system))
            }
            Err(failure) => {
                go_on_without(
                    failure,
                    plan.trigger,
                    "the turn's earlier steps could not be summarised; they are sent whole",
                )?;
                Ok(None)
            }
        }
    }

    /// Asks the model for a summary of `window.messages[..plan.cut]` (and the previous summary).
    async fn summarise_history(
        &self,
        turn: &TurnInput<'_>,
        window: &Window<'_>,
        plan: &Plan,
        model: &str,
        context_tokens: u64,
    ) -> Result<(Summary, Usage), Failure> {
        let span = tracing::info_span!(
            "compact_history",
            "gen_ai.request.model" = %model,
            "skein.compaction.trigger" = plan.trigger.as_str(),
            "skein.compaction.messages" = plan.cut,
            "skein.compaction.tokens_before" = plan.tokens_before,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let previous = window.summary.as_ref();
        let messages = compaction::summary_request(
            previous.map(|s| s.text.as_str()),
            &window.messages[..plan.cut],
            &self.settings.context,
            transcript_bytes(context_tokens),
        );
        let (text, usage) = self
            .ask_summary(turn, span, model, messages, context_tokens)
            .await?;
        let covered = previous.map_or(0, |s| s.messages) + plan.cut as u64;
        Ok((
            Summary {
                text,
                messages: covered,
            },
            usage,
        ))
    }

    /// Asks the model for a summary of the turn's steps `plan.from..plan.cut` (and the summary
    /// of its steps before them).
    async fn summarise_steps(
        &self,
        turn: &TurnInput<'_>,
        out: &TurnOutput,
        plan: &StepsPlan,
        model: &str,
        context_tokens: u64,
    ) -> Result<(String, Usage), Failure> {
        let span = tracing::info_span!(
            "compact_turn",
            "gen_ai.request.model" = %model,
            "skein.compaction.trigger" = plan.trigger.as_str(),
            "skein.compaction.messages" = plan.cut - plan.from,
            "skein.compaction.tokens_before" = plan.tokens_before,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        let turn_messages = &out.new_messages;
        let messages = compaction::steps_summary_request(
            turn_messages.first().map_or("", |m| m.content.as_str()),
            steps_summary(out).map(|s| s.text.as_str()),
            &turn_messages[plan.from..plan.cut],
            &self.settings.context,
            transcript_bytes(context_tokens),
        );
        self.ask_summary(turn, span, model, messages, context_tokens)
            .await
    }

    /// One summary call, in `span`, through the model service and its middleware (retries,
    /// traffic limits, budgets), without tools: the summary's text (cut to its head and tail when
    /// longer than a quarter of the context) and what the call used.
    async fn ask_summary(
        &self,
        turn: &TurnInput<'_>,
        span: tracing::Span,
        model: &str,
        messages: Vec<Message>,
        context_tokens: u64,
    ) -> Result<(String, Usage), Failure> {
        let call = ModelCall {
            request: ModelRequest {
                model: model.to_owned(),
                agent: turn.agent.name.clone(),
                messages: std::sync::Arc::new(messages),
                tools: ToolList::default(),
                max_output_tokens: None,
                output_schema: None,
            },
            deltas: None,
            origin: Some(turn.origin.clone()),
        };
        let answered = self.model.clone().oneshot(call);
        let result = async {
            let response = tokio::select! {
                _ = turn.cancel.cancelled() => Err(Failure::new(FailureKind::Cancelled, "turn cancelled")),
                result = answered => result.map_err(failure_from_error),
            }?;
            let text = response.message.content.trim();
            if text.is_empty() {
                return Err(Failure::new(
                    FailureKind::ModelFailed,
                    "the model's summary was empty",
                ));
            }
            Ok((
                compaction::cut_middle(text, compaction::max_summary_bytes(context_tokens)),
                response.usage,
            ))
        }
        .instrument(span.clone())
        .await;
        if let Err(failure) = &result {
            super::record_failure(&span, failure);
        }
        result
    }
}

/// The most of a summary request's transcript, in bytes: bytes bound tokens, so a transcript
/// within 60% of the context fits in tokens with room for the instructions and the answer.
fn transcript_bytes(context_tokens: u64) -> usize {
    usize::try_from(context_tokens.saturating_mul(60) / 100).unwrap_or(usize::MAX)
}

/// Whether the turn goes on after a summary could not be made: not when it was cancelled or its
/// budget refused the call (its next call would be refused too); otherwise `what` is logged.
fn go_on_without(failure: Failure, trigger: Trigger, what: &str) -> Result<(), Failure> {
    if matches!(
        failure.kind,
        FailureKind::Cancelled | FailureKind::BudgetExhausted
    ) {
        return Err(failure);
    }
    tracing::warn!(error = %failure.message, trigger = trigger.as_str(), "{what}");
    Ok(())
}

/// Emits `compacted`: `messages` left the context, `tokens_after` counts the next request.
async fn emit_compacted(
    turn: &TurnInput<'_>,
    messages: usize,
    trigger: Trigger,
    tokens_before: u64,
    tokens_after: u64,
) {
    turn.events
        .emit(EventKind::Compacted {
            messages: messages as u64,
            trigger: trigger.as_str().to_owned(),
            tokens_before,
            tokens_after,
        })
        .await;
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio_util::sync::CancellationToken;
    use tower::util::BoxCloneSyncService;

    use super::*;
    use crate::agent::compaction::SUMMARY_INSTRUCTIONS;
    use crate::agent::memory::{FixedDirectory, InMemoryTools, MemoryEvents, ToolFn};
    use crate::agent::middleware::Middleware;
    use crate::agent::model::ModelResponse;
    use crate::agent::runtime::{RuntimeSettings, TurnStop};
    use crate::agent::seams::{BoxError, CheckpointSink, TurnCheckpoint};
    use crate::agent::skills::SkillCatalog;
    use crate::protocol::message::Usage;
    use crate::protocol::{AgentSpec, TaskOrigin, TurnStatus};

    /// A model (the tokenizer does not know it: estimated) that answers a summary request with
    /// `summary` and any other with "done"; every request it got is kept.
    fn runtime(summary: Result<&str, Failure>) -> (Runtime, Arc<Mutex<Vec<ModelRequest>>>) {
        let summary = summary.map(str::to_owned);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        let model = tower::service_fn(move |call: ModelCall| {
            let (kept, summary) = (kept.clone(), summary.clone());
            async move {
                let asks_summary = call.request.messages[0].content == SUMMARY_INSTRUCTIONS;
                kept.lock().expect("requests").push(call.request);
                let text = if asks_summary {
                    summary.map_err(|failure| Box::new(failure) as BoxError)?
                } else {
                    "done".to_owned()
                };
                Ok::<_, BoxError>(ModelResponse {
                    message: Message::assistant(text),
                    finish_reason: Some("stop".into()),
                    usage: Usage::default(),
                })
            }
        });
        let tools = InMemoryTools::new(Vec::<(ToolSpec, ToolFn)>::new());
        let runtime = Runtime::new(
            BoxCloneSyncService::new(model),
            BoxCloneSyncService::new(tools.clone().map_err(Into::into)),
            Arc::new(FixedDirectory(Arc::new(tools.catalog()))),
            SkillCatalog::default(),
            Middleware::new(),
            RuntimeSettings {
                default_model: "local-model".into(),
                provider: "test".into(),
                ..RuntimeSettings::default()
            },
        );
        (runtime, seen)
    }

    fn agent() -> AgentSpec {
        AgentSpec {
            name: "assistant".into(),
            description: String::new(),
            system_prompt: "Be brief.".into(),
            model: String::new(),
            tools: Vec::new(),
            subagents: Vec::new(),
            max_iterations: 4,
            permissions: Default::default(),
            skills: None,
            context_tokens: Some(4_096),
            fallback_models: Vec::new(),
            planning: false,
            max_parallel_steps: None,
            max_concurrency: None,
            budget: None,
            output_schema: None,
        }
    }

    /// Five earlier turns of ~600 tokens each: over 75% of the agent's 4,096.
    fn history() -> Vec<Message> {
        (0..5)
            .flat_map(|i| {
                [
                    Message::user(format!("q{i} {}", "u".repeat(1_200))),
                    Message::assistant(format!("a{i} {}", "a".repeat(1_200))),
                ]
            })
            .collect()
    }

    async fn run(
        runtime: &Runtime,
        history: &[Message],
        summary: Option<&Summary>,
    ) -> (TurnOutput, Vec<EventKind>) {
        let agent = agent();
        let (output, events) = run_turn(runtime, &agent, history, summary, None, None).await;
        (output.expect("the turn ends"), events)
    }

    async fn run_turn(
        runtime: &Runtime,
        agent: &AgentSpec,
        history: &[Message],
        summary: Option<&Summary>,
        resume: Option<TurnCheckpoint>,
        checkpoints: Option<&dyn CheckpointSink>,
    ) -> (Result<TurnOutput, TurnStop>, Vec<EventKind>) {
        let events = Arc::new(MemoryEvents::default());
        let cancel = CancellationToken::new();
        let first_run = resume.is_none();
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
                history,
                summary,
                loaded_skills: &[],
                plan: None,
                skills: None,
                input: "go on".into(),
                input_images: Vec::new(),
                depth: 0,
                events: events.clone(),
                cancel: &cancel,
                resume: resume.map(Box::new),
                first_run,
                checkpoints,
                approvals: None,
                controls: None,
                recorded: None,
            })
            .await;
        (output, events.events())
    }

    #[tokio::test]
    async fn the_tokens_after_a_compaction_are_those_of_the_next_request() {
        let (runtime, requests) = runtime(Ok("short summary"));
        let history = history();
        // A long earlier summary, which the new one folds in and replaces.
        let earlier = Summary {
            text: "p".repeat(8_000),
            messages: 10,
        };
        let (output, events) = run(&runtime, &history, Some(&earlier)).await;
        assert_eq!(output.status, TurnStatus::Completed, "{output:?}");
        let (before, after) = events
            .iter()
            .find_map(|e| match e {
                EventKind::Compacted {
                    tokens_before,
                    tokens_after,
                    ..
                } => Some((*tokens_before, *tokens_after)),
                _ => None,
            })
            .expect("the history was compacted");
        let requests = requests.lock().expect("requests");
        let sent = requests.last().expect("the answer's request");
        assert!(sent.messages[0].content.contains("short summary"));
        assert!(!sent.messages[0].content.contains("ppp"));
        let counted = TokenCounter::Estimate.messages(&sent.messages);
        // The request also frames its system prompt as a message (a few tokens).
        assert!(
            after <= counted && counted - after <= 8,
            "{after} reported, {counted} sent (before: {before})"
        );
        assert!(after < before);
    }

    #[tokio::test]
    async fn a_summary_longer_than_a_quarter_of_the_context_is_cut() {
        let long = format!("HEAD{}TAIL", "s".repeat(20_000));
        let (runtime, _) = runtime(Ok(&long));
        let (output, _) = run(&runtime, &history(), None).await;
        assert_eq!(output.status, TurnStatus::Completed, "{output:?}");
        let summary = output
            .compaction
            .and_then(|c| c.summary)
            .expect("compacted")
            .text;
        // A quarter of the agent's 4,096 tokens, in bytes, and the cut's note.
        assert!(summary.len() <= 1_024 + 64, "{}", summary.len());
        assert!(summary.starts_with("HEAD") && summary.ends_with("TAIL"));
    }

    #[tokio::test]
    async fn a_budget_that_refuses_the_summary_ends_the_turn_budget_exhausted() {
        let refused = Failure::new(
            FailureKind::BudgetExhausted,
            "the task's budget is exhausted",
        );
        let (runtime, requests) = runtime(Err(refused));
        let (output, events) = run(&runtime, &history(), None).await;
        assert_eq!(output.status, TurnStatus::BudgetExhausted, "{output:?}");
        assert_eq!(
            output.failure.map(|f| f.kind),
            Some(FailureKind::BudgetExhausted)
        );
        assert_eq!(
            requests.lock().expect("requests").len(),
            1,
            "only the summary was asked"
        );
        assert!(!events
            .iter()
            .any(|e| matches!(e, EventKind::Compacted { .. })));
    }

    /// The context the stepping model holds (the agent's too, unless a test says otherwise): a
    /// request over it is refused as too long, as a model server does.
    const CONTEXT: u64 = 4_096;

    /// What `fetch {page}` returns: the page's number, then `bytes` bytes in all.
    fn page(page: u64, bytes: usize) -> String {
        let head = format!("page {page}: ");
        let fill = "x".repeat(bytes.saturating_sub(head.len()));
        head + &fill
    }

    fn is_summary(request: &ModelRequest) -> bool {
        request.messages[0].content == SUMMARY_INSTRUCTIONS || is_steps_summary(request)
    }

    fn is_steps_summary(request: &ModelRequest) -> bool {
        request.messages[0].content == compaction::STEPS_SUMMARY_INSTRUCTIONS
    }

    /// A runtime whose model works through `steps` calls of `fetch` (`c0`, `c1`, ...: one a step,
    /// the next after the latest result the request shows, so it needs no memory of its own),
    /// then answers "answered after N steps". It answers a summary request of either kind with
    /// `summary` and the summary's number (`#1`, `#2`, ...), and refuses a request of more than
    /// `model_context` tokens (estimated) as too long. `fetch` answers pages of `result_bytes`.
    fn stepping_runtime(
        steps: u64,
        result_bytes: usize,
        summary: Result<&str, Failure>,
        model_context: u64,
    ) -> (Runtime, Arc<Mutex<Vec<ModelRequest>>>) {
        let summary = summary.map(str::to_owned);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        let summaries = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let model = tower::service_fn(move |call: ModelCall| {
            let (kept, summary, summaries) = (kept.clone(), summary.clone(), summaries.clone());
            async move {
                let request = call.request;
                kept.lock().expect("requests").push(request.clone());
                let counter = TokenCounter::Estimate;
                if counter.messages(&request.messages) + counter.tools(&request.tools)
                    > model_context
                {
                    let refused = Failure::new(
                        FailureKind::ContextOverflow,
                        "this model's maximum context length is exceeded",
                    );
                    return Err(Box::new(refused) as BoxError);
                }
                let message = if is_summary(&request) {
                    let text = summary.map_err(|failure| Box::new(failure) as BoxError)?;
                    let n = summaries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    Message::assistant(format!("{text} #{n}"))
                } else {
                    let next = request
                        .messages
                        .iter()
                        .rev()
                        .find_map(|m| m.tool_call_id.as_deref()?.strip_prefix('c'))
                        .and_then(|k| k.parse::<u64>().ok())
                        .map_or(0, |k| k + 1);
                    if next >= steps {
                        Message::assistant(format!("answered after {steps} steps"))
                    } else {
                        let mut message = Message::assistant("");
                        message.tool_calls.push(crate::protocol::message::ToolCall {
                            id: format!("c{next}"),
                            name: "fetch".into(),
                            arguments: serde_json::json!({ "page": next }),
                        });
                        message
                    }
                };
                Ok::<_, BoxError>(ModelResponse {
                    message,
                    finish_reason: Some("stop".into()),
                    usage: Usage::default(),
                })
            }
        });
        let fetch: ToolFn = Arc::new(move |args: serde_json::Value| {
            let text = page(args["page"].as_u64().unwrap_or(0), result_bytes);
            Box::pin(async move { Ok(text) })
        });
        let spec = ToolSpec {
            name: "fetch".into(),
            description: "Fetches a page.".into(),
            parameters: serde_json::json!({"type": "object"}),
            concurrency_safe: true,
            effects: Default::default(),
        };
        let tools = InMemoryTools::new([(spec, fetch)]);
        let runtime = Runtime::new(
            BoxCloneSyncService::new(model),
            BoxCloneSyncService::new(tools.clone().map_err(Into::into)),
            Arc::new(FixedDirectory(Arc::new(tools.catalog()))),
            SkillCatalog::default(),
            Middleware::new(),
            RuntimeSettings {
                default_model: "local-model".into(),
                provider: "test".into(),
                ..RuntimeSettings::default()
            },
        );
        (runtime, seen)
    }

    fn stepping_agent() -> AgentSpec {
        AgentSpec {
            tools: vec!["fetch".into()],
            max_iterations: 12,
            context_tokens: Some(CONTEXT),
            ..agent()
        }
    }

    /// Every tool result follows the assistant message that made its call, and every call of
    /// an assistant message is answered right after it.
    fn assert_calls_and_results_paired(messages: &[Message]) {
        let mut i = 0;
        while i < messages.len() {
            let message = &messages[i];
            assert_ne!(
                message.role,
                crate::protocol::message::Role::Tool,
                "a result without its call at {i}: {messages:?}"
            );
            i += 1;
            let calls: Vec<&str> = message.tool_calls.iter().map(|c| c.id.as_str()).collect();
            let results: Vec<&str> = messages[i..]
                .iter()
                .take_while(|m| m.role == crate::protocol::message::Role::Tool)
                .filter_map(|m| m.tool_call_id.as_deref())
                .collect();
            if !calls.is_empty() {
                // The latest step's calls may still wait for their results only at the end.
                if i < messages.len() {
                    assert_eq!(calls, results, "calls and results at {i}");
                }
            }
            i += results.len();
        }
    }

    /// Six steps of 3,000-byte results (~750 tokens each) in a context of 4,096 tokens: the
    /// fifth request would be over 75% of it, the seventh over all of it.
    async fn six_steps() -> (TurnOutput, Vec<EventKind>, Vec<ModelRequest>) {
        let (runtime, requests) = stepping_runtime(6, 3_000, Ok("steps summary"), CONTEXT);
        let (output, events) = run_turn(&runtime, &stepping_agent(), &[], None, None, None).await;
        let requests = requests.lock().expect("requests").clone();
        (output.expect("the turn ends"), events, requests)
    }

    #[tokio::test]
    async fn a_turn_whose_steps_outgrow_the_context_is_summarised_and_goes_on_to_answer() {
        let (output, events, requests) = six_steps().await;
        assert_eq!(output.status, TurnStatus::Completed, "{:?}", output.failure);
        assert_eq!(output.answer.as_deref(), Some("answered after 6 steps"));
        let compacted: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                EventKind::Compacted {
                    messages,
                    trigger,
                    tokens_before,
                    tokens_after,
                } => Some((*messages, trigger.clone(), *tokens_before, *tokens_after)),
                _ => None,
            })
            .collect();
        assert_eq!(compacted.len(), 1, "{compacted:?}");
        let (messages, trigger, before, after) = compacted[0].clone();
        // The first three steps (call and result each); the fourth, the latest, is kept.
        assert_eq!((messages, trigger.as_str()), (6, "tokens"));
        assert!(
            before > CONTEXT * 75 / 100 && after < before / 2,
            "{before} -> {after}"
        );
        assert_eq!(requests.iter().filter(|r| is_steps_summary(r)).count(), 1);
        assert!(!requests
            .iter()
            .any(|r| r.messages[0].content == SUMMARY_INSTRUCTIONS));
        // The session's summary is untouched; the turn's steps have theirs.
        let compaction = output.compaction.expect("the turn compacted its steps");
        assert_eq!(compaction.summary, None);
        assert_eq!(compaction.compacted, 0);
        assert_eq!(
            compaction.steps.as_deref(),
            Some(&Summary {
                text: "steps summary #1".into(),
                messages: 6
            })
        );
        // The session stores the turn whole: every result verbatim.
        assert_eq!(output.new_messages.len(), 1 + 6 * 2 + 1);
        for k in 0..6 {
            assert!(
                output
                    .new_messages
                    .iter()
                    .any(|m| m.content == page(k, 3_000)),
                "result {k} is kept whole"
            );
        }
    }

    #[tokio::test]
    async fn the_request_after_compacting_steps_holds_the_summary_the_latest_step_and_no_orphan() {
        let (output, _, requests) = six_steps().await;
        assert_eq!(output.status, TurnStatus::Completed, "{:?}", output.failure);
        let at = requests
            .iter()
            .position(is_steps_summary)
            .expect("the steps were summarised");
        // The summary request: the turn's input, then each summarised call with its arguments
        // and its result, named by tool; not the latest step.
        let transcript = &requests[at].messages[1].content;
        assert!(
            transcript.starts_with("The request the agent works on:\ngo on\n"),
            "{transcript:.300}"
        );
        for k in 0..3 {
            assert!(
                transcript.contains(&format!("called fetch (c{k}) with {{\"page\":{k}}}")),
                "{transcript:.300}"
            );
            assert!(transcript.contains(&format!("tool result (fetch c{k}): page {k}: ")));
        }
        assert!(
            !transcript.contains("c3"),
            "the latest step is not summarised"
        );

        // The next request: the summary in the system prompt, the input, then the latest step
        // (its call and its whole result), nothing of the summarised steps.
        let next = &requests[at + 1].messages;
        assert!(next[0]
            .content
            .contains("Summary of your earlier steps in this turn (6 messages compacted"));
        assert!(next[0].content.contains("steps summary #1"));
        assert_eq!(next[1].content, "go on");
        assert_eq!(next[2].tool_calls[0].id, "c3");
        assert_eq!(next[3].tool_call_id.as_deref(), Some("c3"));
        assert_eq!(next[3].content, page(3, 3_000));
        assert_eq!(next.len(), 4);
        for request in requests.iter().filter(|r| !is_summary(r)) {
            assert_calls_and_results_paired(&request.messages[1..]);
            let tokens = TokenCounter::Estimate.messages(&request.messages);
            assert!(tokens <= CONTEXT, "a request of {tokens} tokens");
        }
        // Later requests carry the same summary, and what followed verbatim.
        let last = &requests.last().expect("requests").messages;
        assert!(last[0].content.contains("steps summary #1"));
        assert!(last.iter().any(|m| m.content == page(5, 3_000)));
        assert!(!last.iter().any(|m| m.content.starts_with("page 2: ")));
    }

    #[tokio::test]
    async fn a_single_result_larger_than_the_context_fails_context_overflow_saying_so() {
        // ~5,000 tokens of one result, in a context of 4,096.
        let (runtime, requests) = stepping_runtime(3, 20_000, Ok("steps summary"), CONTEXT);
        let (output, events) = run_turn(&runtime, &stepping_agent(), &[], None, None, None).await;
        let output = output.expect("the turn ends");
        assert_eq!(output.status, TurnStatus::Failed);
        let failure = output.failure.expect("a failure");
        assert_eq!(failure.kind, FailureKind::ContextOverflow, "{failure:?}");
        assert!(
            failure
                .message
                .contains("more than the model's context of 4096")
                && failure.message.contains("its latest step ~")
                && failure
                    .message
                    .contains("its largest result, from fetch, is 20000 bytes"),
            "{}",
            failure.message
        );
        // The oversized request is sent once (a count is an estimate; the model knows its
        // context), refused, and not sent again; no summary is asked that could not help.
        assert_eq!(requests.lock().expect("requests").len(), 2);
        assert!(!events
            .iter()
            .any(|e| matches!(e, EventKind::Compacted { .. })));
        // The turn's work so far is kept with its failure.
        assert_eq!(output.new_messages.len(), 3);
    }

    #[tokio::test]
    async fn a_model_that_refuses_the_latest_step_alone_fails_the_turn_saying_so() {
        // The agent claims 4,096 tokens; the model holds 1,500: a 8,000-byte result (~2,000
        // tokens) is under the agent's threshold but over the model's context.
        let (runtime, requests) = stepping_runtime(3, 8_000, Ok("steps summary"), 1_500);
        let (output, _) = run_turn(&runtime, &stepping_agent(), &[], None, None, None).await;
        let output = output.expect("the turn ends");
        let failure = output.failure.expect("a failure");
        assert_eq!(failure.kind, FailureKind::ContextOverflow, "{failure:?}");
        assert!(
            failure.message.starts_with(
                "the model refused the request as longer than its context, and nothing is left \
                 to compact"
            ) && failure.message.contains("from fetch, is 8000 bytes"),
            "{}",
            failure.message
        );
        // The refused request is not sent again as it was, and nothing was summarised.
        let requests = requests.lock().expect("requests");
        assert_eq!(requests.len(), 2);
        assert!(!requests.iter().any(is_summary));
    }

    /// Keeps every checkpoint, in order.
    #[derive(Default)]
    struct AllCheckpoints(Mutex<Vec<TurnCheckpoint>>);

    impl CheckpointSink for AllCheckpoints {
        fn save<'a>(
            &'a self,
            state: &'a TurnCheckpoint,
        ) -> futures::future::BoxFuture<'a, Result<(), Failure>> {
            self.0.lock().expect("checkpoints").push(state.clone());
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test]
    async fn a_turn_resumed_after_compacting_its_steps_keeps_the_summary() {
        let (runtime, requests) = stepping_runtime(6, 3_000, Ok("steps summary"), CONTEXT);
        let agent = stepping_agent();
        let checkpoints = AllCheckpoints::default();
        let (output, _) = run_turn(&runtime, &agent, &[], None, None, Some(&checkpoints)).await;
        let output = output.expect("the turn ends");
        assert_eq!(output.status, TurnStatus::Completed, "{:?}", output.failure);
        let checkpoint = checkpoints
            .0
            .lock()
            .expect("checkpoints")
            .iter()
            .find(|c| c.compaction.as_ref().is_some_and(|c| c.steps.is_some()))
            .cloned()
            .expect("a checkpoint after the steps were compacted");
        let steps = checkpoint
            .compaction
            .as_ref()
            .and_then(|c| c.steps.clone())
            .expect("the steps' summary");
        // A checkpoint stores the turn's messages whole, and the summary beside them.
        assert_eq!(steps.messages, 6);
        assert!(checkpoint
            .new_messages
            .iter()
            .any(|m| m.content == page(0, 3_000)));

        // Another runtime resumes it (as another lead would).
        let (resumer, resumed_requests) =
            stepping_runtime(6, 3_000, Ok("another summary"), CONTEXT);
        let (resumed, _) = run_turn(&resumer, &agent, &[], None, Some(checkpoint), None).await;
        let resumed = resumed.expect("the resumed turn ends");
        assert_eq!(
            resumed.status,
            TurnStatus::Completed,
            "{:?}",
            resumed.failure
        );
        assert_eq!(resumed.answer, output.answer);
        let resumed_requests = resumed_requests.lock().expect("requests");
        assert!(
            !resumed_requests.iter().any(is_summary),
            "the resumed turn does not summarise again"
        );
        let first = &resumed_requests[0].messages;
        assert!(
            first[0].content.contains(&steps.text),
            "{:.300}",
            first[0].content
        );
        for k in 0..3 {
            let summarised = format!("page {k}: ");
            assert!(
                !first.iter().any(|m| m.content.starts_with(&summarised)),
                "result {k} is not sent again"
            );
        }
        assert_calls_and_results_paired(&first[1..]);
        assert_eq!(
            resumed.compaction.and_then(|c| c.steps),
            Some(steps),
            "the resumed turn reports the summary it went on with"
        );
        assert_eq!(resumed.new_messages, output.new_messages);
        assert!(requests.lock().expect("requests").len() > resumed_requests.len());
    }

    #[tokio::test]
    async fn a_turn_that_fills_the_context_summarises_every_earlier_turn_before_its_steps() {
        let (runtime, requests) = stepping_runtime(6, 3_000, Ok("a summary"), CONTEXT);
        let history = history();
        let (output, _) = run_turn(&runtime, &stepping_agent(), &history, None, None, None).await;
        let output = output.expect("the turn ends");
        assert_eq!(output.status, TurnStatus::Completed, "{:?}", output.failure);
        let compaction = output.compaction.expect("compacted");
        // The whole history went into the session's summary, the older steps into the turn's.
        assert_eq!(compaction.compacted, history.len());
        let summary = compaction.summary.expect("the session's summary");
        assert_eq!(summary.messages, history.len() as u64);
        assert!(compaction.steps.is_some());
        let requests = requests.lock().expect("requests");
        let first_steps = requests
            .iter()
            .position(is_steps_summary)
            .expect("the steps were summarised");
        assert!(requests[..first_steps]
            .iter()
            .any(|r| r.messages[0].content == SUMMARY_INSTRUCTIONS));
        let last = &requests.last().expect("requests").messages;
        assert!(!last.iter().any(|m| m.content.starts_with("q4 ")));
        assert!(last[0].content.contains(&summary.text));
    }

    #[tokio::test]
    async fn a_budget_that_refuses_the_steps_summary_ends_the_turn_budget_exhausted() {
        let refused = Failure::new(
            FailureKind::BudgetExhausted,
            "the task's budget is exhausted",
        );
        let (runtime, requests) = stepping_runtime(6, 3_000, Err(refused), CONTEXT);
        let (output, events) = run_turn(&runtime, &stepping_agent(), &[], None, None, None).await;
        let output = output.expect("the turn ends");
        assert_eq!(output.status, TurnStatus::BudgetExhausted, "{output:?}");
        let requests = requests.lock().expect("requests");
        assert!(is_steps_summary(requests.last().expect("requests")));
        assert_eq!(requests.len(), 5, "four steps, then the refused summary");
        assert!(!events
            .iter()
            .any(|e| matches!(e, EventKind::Compacted { .. })));
    }

    #[test]
    fn a_compaction_checkpointed_before_steps_were_compacted_still_reads() {
        let old = r#"{"summary":{"text":"s","messages":3},"compacted":3}"#;
        let compaction: Compaction = serde_json::from_str(old).expect("an old compaction reads");
        assert_eq!(compaction.compacted, 3);
        assert_eq!(compaction.steps, None);
        let only_steps = Compaction {
            summary: None,
            compacted: 0,
            steps: Some(Box::new(Summary {
                text: "t".into(),
                messages: 4,
            })),
        };
        let written = serde_json::to_string(&only_steps).expect("encodes");
        assert_eq!(
            serde_json::from_str::<Compaction>(&written).expect("reads back"),
            only_steps
        );
    }
}
