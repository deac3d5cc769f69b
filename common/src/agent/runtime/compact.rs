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
}

impl<'t> Window<'t> {
    pub(super) fn new(turn: &TurnInput<'t>, out: &TurnOutput, runtime: &Runtime) -> Self {
        let mut window = Window {
            full: turn.history,
            compacted: 0,
            summary: turn.summary.cloned(),
            messages: Vec::new(),
            bytes: 0,
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
    /// model said it did not). Returns whether it compacted. A summary that cannot be made is
    /// logged and the turn goes on without it (its oldest messages trimmed instead), unless the
    /// turn was cancelled.
    pub(super) async fn fit(
        &self,
        turn: &TurnInput<'_>,
        window: &mut Window<'_>,
        out: &mut TurnOutput,
        request: &Request<'_>,
        overflowed: bool,
    ) -> Result<bool, Failure> {
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
        let count_other = || {
            counter.text(request.system)
                + counter.tools(request.tools)
                + counter.messages(&out.new_messages)
        };
        let Some(plan) = compaction::plan(
            &window.messages,
            size,
            count_other,
            &counter,
            context_tokens,
            limits,
            overflowed,
        ) else {
            return Ok(false);
        };
        match self
            .summarise(turn, window, &plan, request.model, context_tokens)
            .await
        {
            Ok((summary, usage)) => {
                out.usage.add(usage);
                let compacted = window.compacted + plan.cut;
                window.cut(compacted, Some(summary.clone()), self);
                out.compaction = Some(Compaction { summary, compacted });
                let tokens_after = count_other()
                    + counter.messages(&window.messages)
                    + window.summary.as_ref().map_or(0, |s| counter.text(&s.text));
                turn.events
                    .emit(EventKind::Compacted {
                        messages: plan.cut as u64,
                        trigger: plan.trigger.as_str().to_owned(),
                        tokens_before: plan.tokens_before,
                        tokens_after,
                    })
                    .await;
                Ok(true)
            }
            Err(failure) if failure.kind == FailureKind::Cancelled => Err(failure),
            Err(failure) => {
                tracing::warn!(
                    error = %failure.message,
                    trigger = plan.trigger.as_str(),
                    "the history could not be summarised; the oldest messages are left out instead"
                );
                Ok(false)
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
        let max_bytes = usize::try_from(context_tokens * 60 / 100).unwrap_or(usize::MAX);
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
                    text: text.to_owned(),
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
