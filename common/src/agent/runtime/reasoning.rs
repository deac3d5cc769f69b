//! The reasoning step of a turn: one model call to the agent's model, then to each of its
//! fallbacks while the failure is one another model may not have; each inside the reasoning
//! hooks and the model service, in its own `chat` span, with deltas streamed as events.

use std::sync::Arc;

use futures::future::BoxFuture;
use tower::ServiceExt;
use tracing::Instrument;

use super::{record_failure, turn_context, Runtime, TurnInput};
use crate::agent::model::{ModelRequest, ModelResponse};
use crate::agent::seams::{failure_from_error, DeltaSink, EventSink, ModelCall};
use crate::protocol::message::Message;
use crate::protocol::{EventKind, Failure, FailureKind, ToolSpec};

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
        tools: Arc<[ToolSpec]>,
    ) -> Result<ModelResponse, Failure> {
        let primary = self.model_name(turn);
        // Boxed: the call's future is large, and nesting it in every caller's would make theirs so.
        if turn.agent.fallback_models.is_empty() {
            return Box::pin(self.model_call_to(turn, step, primary, messages, tools)).await;
        }
        let mut result = Box::pin(self.model_call_to(
            turn,
            step,
            primary.clone(),
            messages.clone(),
            tools.clone(),
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
                    result = Box::pin(self.model_call_to(
                        turn,
                        step,
                        fallback.clone(),
                        messages.clone(),
                        tools.clone(),
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
        tools: Arc<[ToolSpec]>,
    ) -> Result<ModelResponse, Failure> {
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
            messages,
            tools,
            max_output_tokens: None,
        };
        let started = std::time::Instant::now();
        let result = self
            .reason(turn, step, request)
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

    /// The reasoning step: `before_reasoning` may change the request or answer in the model's
    /// place; the model service streams its answer; `after_reasoning` may change the response.
    async fn reason(
        &self,
        turn: &TurnInput<'_>,
        step: u32,
        request: ModelRequest,
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
            deltas: Some(Arc::new(EventDeltas(turn.events.clone()))),
            origin: Some(Arc::new(turn.origin.clone())),
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

/// Forwards streamed deltas to the turn's events: text as `model_delta`, reasoning as
/// `reasoning_delta`.
struct EventDeltas(Arc<dyn EventSink>);

impl DeltaSink for EventDeltas {
    fn delta(&self, text: String) -> BoxFuture<'_, ()> {
        self.0.emit(EventKind::ModelDelta { text })
    }

    fn reasoning(&self, text: String) -> BoxFuture<'_, ()> {
        self.0.emit(EventKind::ReasoningDelta { text })
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
