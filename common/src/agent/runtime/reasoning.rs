//! The reasoning step of a turn: one model call to the agent's model, then to each of its
//! fallbacks while the failure is one another model may not have; each inside the reasoning
//! hooks and the model service, in its own `chat` span, with deltas streamed as events.
//!
//! Invariant: the deltas a client sees after a step's last `output_discarded` are those of the
//! attempt whose response the step returns. An attempt that streamed and failed is followed by
//! `output_discarded` before anything else streams: the retry layer says so before it tries
//! again ([`DeltaSink::discard`]), the step itself before it asks a fallback model.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use tower::ServiceExt;
use tracing::Instrument;

use super::{record_failure, turn_context, Runtime, TurnInput};
use crate::agent::model::{ModelRequest, ModelResponse, ToolList};
use crate::agent::seams::{failure_from_error, DeltaSink, EventSink, ModelCall};
use crate::protocol::message::Message;
use crate::protocol::{EventKind, Failure, FailureKind, OutputSchema};

impl Runtime {
    /// The model an agent's turn asks first.
    pub(super) fn model_name(&self, turn: &TurnInput<'_>) -> String {
        if turn.agent.model.is_empty() {
            self.settings.default_model.clone()
        } else {
            turn.agent.model.clone()
        }
    }

    /// One model call, to the agent's model and then, while the failure is one another model
    /// may not have (unreachable, overloaded, timed out, refusing), to each of its fallbacks.
    pub(super) async fn model_call(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        messages: Vec<Message>,
        tools: ToolList,
        output_schema: Option<Arc<OutputSchema>>,
    ) -> Result<ModelResponse, Failure> {
        let primary = self.model_name(turn);
        let deltas = Arc::new(EventDeltas::new(turn.events.clone()));
        let asked = Asked {
            tools,
            output_schema,
        };
        // Boxed: the call's future is large, and nesting it in every caller's would make theirs so.
        if turn.agent.fallback_models.is_empty() {
            return Box::pin(self.model_call_to(turn, step, primary, messages, asked, &deltas))
                .await;
        }
        let mut result = Box::pin(self.model_call_to(
            turn,
            step,
            primary.clone(),
            messages.clone(),
            asked.clone(),
            &deltas,
        ))
        .await;
        for fallback in &turn.agent.fallback_models {
            match &result {
                Err(failure) if worth_a_fallback(failure) => {
                    tracing::warn!(
                        model = %primary,
                        fallback = %fallback,
                        error = %failure,
                        "model failed; trying the agent's next fallback model"
                    );
                    // What the failed model streamed is not the answer the fallback gives.
                    deltas.discard(failure.clone()).await;
                    result = Box::pin(self.model_call_to(
                        turn,
                        step,
                        fallback.clone(),
                        messages.clone(),
                        asked.clone(),
                        &deltas,
                    ))
                    .await;
                }
                _ => break,
            }
        }
        result
    }

    /// One model call to `model` inside the reasoning hooks and the model service; deltas become
    /// events.
    async fn model_call_to(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        model: String,
        messages: Vec<Message>,
        asked: Asked,
        deltas: &Arc<EventDeltas>,
    ) -> Result<ModelResponse, Failure> {
        let provider = self.settings.provider_of(&model).to_owned();
        let span = tracing::info_span!(
            "chat",
            "otel.name" = format!("chat {model}"),
            "otel.kind" = "client",
            "gen_ai.operation.name" = "chat",
            "gen_ai.provider.name" = %provider,
            "gen_ai.request.model" = %model,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "gen_ai.response.finish_reasons" = tracing::field::Empty,
            "gen_ai.input.messages" = tracing::field::Empty,
            "gen_ai.output.messages" = tracing::field::Empty,
            // Recorded by the budget layer: what the call spent, at the model's price.
            "skein.spent.tokens" = tracing::field::Empty,
            "skein.spent.cost_usd" = tracing::field::Empty,
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
            messages: Arc::new(messages),
            tools: asked.tools,
            max_output_tokens: None,
            output_schema: asked.output_schema,
        };
        let started = std::time::Instant::now();
        let result = self
            .reason(turn, step, request, deltas.clone())
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
                // In the call's span: its duration's exemplar names it.
                span.in_scope(|| {
                    self.metrics.model_call(
                        &provider,
                        "ok",
                        duration,
                        response.usage.prompt_tokens,
                        response.usage.completion_tokens,
                    )
                });
            }
            Err(failure) => {
                record_failure(&span, failure);
                span.in_scope(|| {
                    self.metrics
                        .model_call(&provider, failure.kind.as_str(), duration, 0, 0)
                });
            }
        }
        result
    }

    /// The reasoning step: `before_reasoning` may change the request or answer in the model's
    /// place; the model service streams its answer; `after_reasoning` may change the response.
    async fn reason(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        request: ModelRequest,
        deltas: Arc<EventDeltas>,
    ) -> Result<ModelResponse, Failure> {
        let hooks = self.middleware.hooks();
        let ctx = (!hooks.is_empty()).then(|| turn_context(turn, step));
        let request = match &ctx {
            Some(ctx) => match hooks.enter_reasoning(ctx, request).await {
                Ok(request) => request,
                // A hook answered in the model's place (its outer hooks' `after_reasoning` ran).
                Err(response) => return Ok(response),
            },
            None => request,
        };
        let call = ModelCall {
            request,
            deltas: Some(deltas),
            origin: Some(turn.origin.clone()),
        };
        let answered = self.model.clone().oneshot(call);
        let response = tokio::select! {
            _ = turn.cancel.cancelled() => Err(Failure::new(FailureKind::Cancelled, "turn cancelled")),
            result = answered => result.map_err(failure_from_error),
        }?;
        Ok(match &ctx {
            Some(ctx) => hooks.exit_reasoning(ctx, response).await,
            None => response,
        })
    }
}

/// What a model call offers besides the conversation: its tools and the output schema.
#[derive(Clone)]
struct Asked {
    tools: ToolList,
    output_schema: Option<Arc<OutputSchema>>,
}

/// Forwards streamed deltas to the turn's events: text as `model_delta`, reasoning as
/// `reasoning_delta`, and a discarded attempt's as `output_discarded` (only when it streamed
/// something since the last one: a client has nothing to drop otherwise).
struct EventDeltas {
    events: Arc<dyn EventSink>,
    /// Whether a delta went out since the call began or since the last discard.
    streamed: AtomicBool,
}

impl EventDeltas {
    fn new(events: Arc<dyn EventSink>) -> Self {
        Self {
            events,
            streamed: AtomicBool::new(false),
        }
    }
}

impl DeltaSink for EventDeltas {
    fn delta(&self, text: String) -> BoxFuture<'_, ()> {
        self.streamed.store(true, Ordering::Release);
        self.events.emit(EventKind::ModelDelta { text })
    }

    fn reasoning(&self, text: String) -> BoxFuture<'_, ()> {
        self.streamed.store(true, Ordering::Release);
        self.events.emit(EventKind::ReasoningDelta { text })
    }

    fn discard(&self, failure: Failure) -> BoxFuture<'_, ()> {
        if !self.streamed.swap(false, Ordering::AcqRel) {
            return Box::pin(futures::future::ready(()));
        }
        self.events.emit(EventKind::OutputDiscarded { failure })
    }
}

/// Whether a failed model call may succeed on another model: any failure of the model (an error
/// answer, unreachable, too slow), not a cancellation, a request too long for the context or
/// invalid, or a spent budget.
fn worth_a_fallback(failure: &Failure) -> bool {
    matches!(
        failure.kind,
        FailureKind::ModelFailed | FailureKind::Unavailable | FailureKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio_util::sync::CancellationToken;
    use tower::util::BoxCloneSyncService;

    use super::*;
    use crate::agent::memory::{FixedDirectory, InMemoryTools, MemoryEvents, ToolFn};
    use crate::agent::middleware::Middleware;
    use crate::agent::runtime::{RuntimeSettings, TurnOutput};
    use crate::agent::seams::BoxError;
    use crate::agent::skills::SkillCatalog;
    use crate::protocol::message::{Role, Usage};
    use crate::protocol::{AgentSpec, TaskOrigin, TurnStatus};

    /// One scripted answer of the model: what it streams, then its text or its failure.
    type Reply = (&'static str, Result<&'static str, Failure>);

    /// A runtime (the standard middleware: model calls retried) whose model plays `replies` in
    /// turn, streaming each before it ends; every model it was asked is kept.
    fn runtime(replies: Vec<Reply>) -> (Runtime, Arc<Mutex<Vec<String>>>) {
        let replies = Arc::new(Mutex::new(replies));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let kept = asked.clone();
        let model = tower::service_fn(move |call: ModelCall| {
            let (replies, kept) = (replies.clone(), kept.clone());
            async move {
                kept.lock().expect("asked").push(call.request.model.clone());
                let (streamed, end) = replies.lock().expect("replies").remove(0);
                if let Some(deltas) = &call.deltas {
                    deltas.delta(streamed.to_owned()).await;
                }
                let text = end.map_err(|failure| Box::new(failure) as BoxError)?;
                Ok::<_, BoxError>(ModelResponse {
                    message: Message::assistant(text),
                    finish_reason: Some("stop".into()),
                    usage: Usage::default(),
                })
            }
        });
        let tools = InMemoryTools::new(Vec::<(crate::protocol::ToolSpec, ToolFn)>::new());
        let runtime = Runtime::new(
            BoxCloneSyncService::new(model),
            BoxCloneSyncService::new(tools.clone().map_err(Into::into)),
            Arc::new(FixedDirectory(Arc::new(tools.catalog()))),
            SkillCatalog::default(),
            Middleware::new(),
            RuntimeSettings {
                default_model: "primary".into(),
                provider: "test".into(),
                ..RuntimeSettings::default()
            },
        );
        (runtime, asked)
    }

    fn agent(fallback_models: Vec<String>) -> AgentSpec {
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
            context_tokens: None,
            fallback_models,
            planning: false,
            max_parallel_steps: None,
            max_concurrency: None,
            budget: None,
            output_schema: None,
        }
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
                input: "what is it?".into(),
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

    /// The streamed events of a turn: `+text` for a delta, `discarded: <message>` for a discard.
    fn streamed(events: &[EventKind]) -> Vec<String> {
        events
            .iter()
            .filter_map(|event| match event {
                EventKind::ModelDelta { text } => Some(format!("+{text}")),
                EventKind::OutputDiscarded { failure } => {
                    Some(format!("discarded: {}", failure.message))
                }
                _ => None,
            })
            .collect()
    }

    fn assistant_texts(output: &TurnOutput) -> Vec<&str> {
        output
            .new_messages
            .iter()
            .filter(|message| message.role == Role::Assistant)
            .map(|message| message.content.as_str())
            .collect()
    }

    /// A stream the server ended with an error after its first tokens: retryable.
    fn broke_off() -> Failure {
        Failure {
            kind: FailureKind::ModelFailed,
            message: "model server error: Provider disconnected unexpectedly".into(),
            retryable: true,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_broke_off_is_discarded_and_the_retry_answers_the_turn() {
        let (runtime, asked) = runtime(vec![
            ("The answer is", Err(broke_off())),
            ("42.", Ok("42.")),
        ]);

        let (output, events) = run_turn(&runtime, &agent(Vec::new())).await;

        assert_eq!(output.status, TurnStatus::Completed);
        assert_eq!(output.answer.as_deref(), Some("42."));
        assert_eq!(
            streamed(&events),
            [
                "+The answer is",
                "discarded: model server error: Provider disconnected unexpectedly",
                "+42."
            ]
        );
        assert_eq!(assistant_texts(&output), ["42."]);
        assert_eq!(*asked.lock().expect("asked"), ["primary", "primary"]);
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_failed_model_streamed_is_discarded_before_its_fallback_answers() {
        let refused = Failure::new(FailureKind::ModelFailed, "model server answered 400");
        let (runtime, asked) = runtime(vec![("The answer is", Err(refused)), ("42.", Ok("42."))]);

        let (output, events) = run_turn(&runtime, &agent(vec!["backup".into()])).await;

        assert_eq!(output.answer.as_deref(), Some("42."));
        assert_eq!(
            streamed(&events),
            [
                "+The answer is",
                "discarded: model server answered 400",
                "+42."
            ]
        );
        assert_eq!(assistant_texts(&output), ["42."]);
        assert_eq!(*asked.lock().expect("asked"), ["primary", "backup"]);
    }
}
