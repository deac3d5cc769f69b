//! The turn's view of its session's history, and compacting it: before each model call the
//! runtime asks whether the request fits the agent's context (`compaction::plan`); when it does
//! not, the older history is summarised by the model (a `compact_history` span with its own
//! `chat` call, and a `compacted` event) and the turn goes on with the summary in its system
//! prompt and only the recent turns verbatim. The turn reports the compaction
//! ([`TurnOutput::compaction`]) so the caller stores it with the session, and checkpoints it, so a
//! resumed turn does not summarise again.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tower::ServiceExt;
use tracing::Instrument;

use super::{Runtime, TurnInput, TurnOutput};
use crate::agent::compaction::{self, Plan, RequestSize};
use crate::agent::context;
use crate::agent::model::ModelRequest;
use crate::agent::seams::{failure_from_error, ModelCall};
use crate::agent::tokens::{self, TokenCounter};
use crate::protocol::message::Message;
use crate::protocol::{EventKind, Failure, FailureKind, ToolSpec};

/// A session's summary of its compacted history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub text: String,
    /// How many messages of the session it stands for (earlier summaries' included).
    pub messages: u64,
}

/// What a turn compacted: its session's new summary, standing for the first `compacted` messages
/// of the history the turn was given (they stay stored, out of the context).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    pub summary: Summary,
    pub compacted: usize,
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
        };
        match &out.compaction {
            Some(done) => window.cut(done.compacted, Some(done.summary.clone()), runtime),
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
}

/// What one request is made of, for deciding whether it fits.
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

    /// Compacts the window's history when `request` would not fit (or, `overflowed`, when the
    /// model said it did not). Returns the system prompt with the new summary when it compacted.
    /// A summary that cannot be made is logged and the turn goes on without it (its oldest
    /// messages trimmed instead), unless the turn was cancelled or its budget refused the call
    /// (the turn's next call would be refused too).
    pub(super) async fn fit(
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
        let size = RequestSize {
            other_bytes: compaction::other_bytes(
                request.system,
                request.tools_bytes,
                &out.new_messages,
            ) + summary_section,
            history_bytes: window.bytes,
        };
        let tools_tokens = &mut window.tools_tokens;
        let count_other = || {
            counter.text(request.system)
                + *tools_tokens.get_or_insert_with(|| counter.tools(request.tools))
                + counter.messages(&out.new_messages)
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
        match self
            .summarise(turn, window, &plan, request.model, context_tokens)
            .await
        {
            Ok((summary, usage)) => {
                out.usage.add(usage);
                window.drop_front(plan.cut, summary.clone());
                out.compaction = Some(Compaction {
                    summary,
                    compacted: window.compacted,
                });
                // Counted as the next request goes out: the new summary in the system prompt
                // (in place of the one it folded in), the history left.
                let system = self.system_prompt(turn, out, window.summary.as_ref());
                let history_tokens: u64 = match &window.counts {
                    Some(counts) => counts.iter().sum(),
                    None => counter.messages(&window.messages),
                };
                let tools_tokens = *window
                    .tools_tokens
                    .get_or_insert_with(|| counter.tools(request.tools));
                let tokens_after = counter.text(&system)
                    + tools_tokens
                    + counter.messages(&out.new_messages)
                    + history_tokens;
                turn.events
                    .emit(EventKind::Compacted {
                        messages: plan.cut as u64,
                        trigger: plan.trigger.as_str().to_owned(),
                        tokens_before: plan.tokens_before,
                        tokens_after,
                    })
                    .await;
                Ok(Some(system))
            }
            Err(failure)
                if matches!(
                    failure.kind,
                    FailureKind::Cancelled | FailureKind::BudgetExhausted
                ) =>
            {
                Err(failure)
            }
            Err(failure) => {
                tracing::warn!(
                    error = %failure.message,
                    trigger = plan.trigger.as_str(),
                    "the history could not be summarised; the oldest messages are left out instead"
                );
                Ok(None)
            }
        }
    }

    /// Asks the model for a summary of `window.messages[..plan.cut]` (and the previous summary).
    async fn summarise(
        &self,
        turn: &TurnInput<'_>,
        window: &Window<'_>,
        plan: &Plan,
        model: &str,
        context_tokens: u64,
    ) -> Result<(Summary, crate::protocol::message::Usage), Failure> {
        let limits = &self.settings.context;
        let span = tracing::info_span!(
            "compact_history",
            "gen_ai.request.model" = %model,
            "skein.compaction.trigger" = plan.trigger.as_str(),
            "skein.compaction.messages" = plan.cut,
            "skein.compaction.tokens_before" = plan.tokens_before,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        // Bytes bound tokens, so a transcript within 60% of the context in bytes fits in tokens
        // with room for the instructions and the answer.
        let max_bytes =
            usize::try_from(context_tokens.saturating_mul(60) / 100).unwrap_or(usize::MAX);
        let previous = window.summary.as_ref();
        let messages = compaction::summary_request(
            previous.map(|s| s.text.as_str()),
            &window.messages[..plan.cut],
            limits,
            max_bytes,
        );
        let call = ModelCall {
            request: ModelRequest {
                model: model.to_owned(),
                agent: turn.agent.name.clone(),
                messages,
                tools: Arc::from([]),
                max_output_tokens: None,
            },
            deltas: None,
            origin: Some(Arc::new(turn.origin.clone())),
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
            let covered = previous.map_or(0, |s| s.messages) + plan.cut as u64;
            Ok((
                Summary {
                    text: compaction::cut_middle(text, compaction::max_summary_bytes(context_tokens)),
                    messages: covered,
                },
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
    use crate::agent::runtime::RuntimeSettings;
    use crate::agent::seams::BoxError;
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
        let events = Arc::new(MemoryEvents::default());
        let cancel = CancellationToken::new();
        let agent = agent();
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
                },
                agent: &agent,
                history,
                summary,
                loaded_skills: &[],
                plan: None,
                skills: None,
                input: "go on".into(),
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
        let summary = output.compaction.expect("compacted").summary.text;
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
}
