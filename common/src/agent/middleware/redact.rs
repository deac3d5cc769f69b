//! Redaction: configured secret values are replaced by [`REDACTED`] in what comes back from the
//! model and the tools, so a secret never reaches the history, the events or the logs.
//!
//! Invariants:
//! - masked: a tool result's output and failure message; a model answer's text, reasoning, the
//!   string values of its tool-call arguments, and its streamed deltas (text and reasoning); the
//!   message of an error (which
//!   leaves the layer as a [`Failure`], see [`failure_from_error`]);
//! - a secret split across two streamed deltas is masked too: the end of a delta that could be
//!   the start of a secret is held back until the next delta (of the same kind: text and
//!   reasoning are held apart), or the end of the call, tells;
//! - where secrets overlap, the longest one found at a position is masked; the text is scanned
//!   once, so a mask is never itself masked again;
//! - requests are not touched: the model and the tools get what they were sent;
//! - every secret is at least [`MIN_SECRET_BYTES`] long: every occurrence of a secret is masked,
//!   inside words too, so a shorter one (an API key of one letter) would mangle ordinary text
//!   (`load_s[redacted]ill`); it is refused where it is configured, never masked nor skipped.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use serde_json::Value;
use tower::{Layer, Service};

use crate::agent::model::ModelResponse;
use crate::agent::seams::{failure_from_error, BoxError, DeltaSink, ModelCall, ToolCallRequest};
use crate::protocol::message::Message;
use crate::protocol::{CallOutcome, Failure, ToolResult};

/// What a secret is replaced by.
pub const REDACTED: &str = "[redacted]";

/// The shortest secret that can be masked safely, in bytes (see the module's invariants).
pub const MIN_SECRET_BYTES: usize = 8;

/// A secret too short to be masked safely; says how long it is, never what it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a secret of {bytes} byte{} cannot be masked safely: every occurrence of it in answers and \
     tool output would be masked, inside ordinary words too; a secret must be at least \
     {MIN_SECRET_BYTES} bytes",
    if *.bytes == 1 { "" } else { "s" }
)]
pub struct SecretTooShort {
    pub bytes: usize,
}

/// The secret values to mask, longest first.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// Empty strings are ignored, duplicates kept once; a secret shorter than
    /// [`MIN_SECRET_BYTES`] is refused.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Result<Self, SecretTooShort> {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        secrets.iter().try_for_each(|secret| Self::check(secret))?;
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Ok(Self { secrets })
    }

    /// Whether `secret` can be masked: it is empty (nothing to mask) or long enough.
    pub fn check(secret: &str) -> Result<(), SecretTooShort> {
        match secret.len() {
            1..MIN_SECRET_BYTES => Err(SecretTooShort {
                bytes: secret.len(),
            }),
            _ => Ok(()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret masked; `None` when it holds none.
    pub fn redact(&self, text: &str) -> Option<String> {
        if !self
            .secrets
            .iter()
            .any(|secret| text.contains(secret.as_str()))
        {
            return None;
        }
        Some(self.mask(text, false).0)
    }

    /// A failure with its message masked.
    pub fn redact_failure(&self, mut failure: Failure) -> Failure {
        self.redact_in_place(&mut failure.message);
        failure
    }

    /// Masks `text` in one scan from its start, the longest secret first at each position.
    /// With `partial`, the text may go on: the scan stops where the rest could be the start of a
    /// secret (or of a longer one than it matches), and says where it stopped.
    fn mask(&self, text: &str, partial: bool) -> (String, usize) {
        let mut masked = String::with_capacity(text.len());
        let (mut copied, mut at) = (0, 0);
        while let Some(rest) = text.get(at..).filter(|rest| !rest.is_empty()) {
            let may_go_on = |secret: &String| secret.len() > rest.len() && secret.starts_with(rest);
            if partial && self.secrets.iter().any(may_go_on) {
                break;
            }
            match self.secrets.iter().find(|s| rest.starts_with(s.as_str())) {
                Some(secret) => {
                    masked.push_str(&text[copied..at]);
                    masked.push_str(REDACTED);
                    at += secret.len();
                    copied = at;
                }
                None => at += rest.chars().next().map_or(1, char::len_utf8),
            }
        }
        masked.push_str(&text[copied..at]);
        (masked, at)
    }

    fn redact_in_place(&self, text: &mut String) {
        if let Some(masked) = self.redact(text) {
            *text = masked;
        }
    }

    fn redact_json(&self, value: &mut Value) {
        match value {
            Value::String(text) => self.redact_in_place(text),
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_json(item)),
            Value::Object(fields) => fields.values_mut().for_each(|v| self.redact_json(v)),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    fn redact_message(&self, message: &mut Message) {
        self.redact_in_place(&mut message.content);
        if let Some(reasoning) = &mut message.reasoning {
            if let Some(masked) = self.redact(reasoning) {
                *reasoning = masked;
                // The signature no longer covers the text: a server would refuse it sent back.
                message.reasoning_signature = None;
            }
        }
        for call in &mut message.tool_calls {
            self.redact_json(&mut call.arguments);
        }
    }

    fn redact_outcome(&self, outcome: &mut CallOutcome) {
        match outcome {
            CallOutcome::Ok { output, .. } => self.redact_in_place(output),
            CallOutcome::Failed { failure } => self.redact_in_place(&mut failure.message),
        }
    }

    fn redact_error(&self, error: BoxError) -> BoxError {
        Box::new(self.redact_failure(failure_from_error(error)))
    }
}

/// Masks secrets in what a tool or model service returns; see the module's invariants.
#[derive(Debug, Clone)]
pub struct RedactLayer {
    redactor: Arc<Redactor>,
}

impl RedactLayer {
    pub fn new(redactor: Arc<Redactor>) -> Self {
        Self { redactor }
    }
}

impl<S> Layer<S> for RedactLayer {
    type Service = Redact<S>;

    fn layer(&self, inner: S) -> Redact<S> {
        Redact {
            inner,
            redactor: self.redactor.clone(),
        }
    }
}

/// The service of [`RedactLayer`].
#[derive(Debug, Clone)]
pub struct Redact<S> {
    inner: S,
    redactor: Arc<Redactor>,
}

impl<S> Service<ToolCallRequest> for Redact<S>
where
    S: Service<ToolCallRequest, Response = ToolResult>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ToolResult;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<ToolResult, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: ToolCallRequest) -> Self::Future {
        let redactor = self.redactor.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            match response.await {
                Ok(mut result) => {
                    redactor.redact_outcome(&mut result.outcome);
                    Ok(result)
                }
                Err(error) => Err(redactor.redact_error(error.into())),
            }
        })
    }
}

impl<S> Service<ModelCall> for Redact<S>
where
    S: Service<ModelCall, Response = ModelResponse>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<ModelResponse, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        let redactor = self.redactor.clone();
        let deltas = call.deltas.take().map(|sink| {
            Arc::new(RedactedDeltas {
                inner: sink,
                redactor: redactor.clone(),
                held: Mutex::new(String::new()),
                held_reasoning: Mutex::new(String::new()),
            })
        });
        call.deltas = deltas.clone().map(|sink| sink as Arc<dyn DeltaSink>);
        let response = self.inner.call(call);
        Box::pin(async move {
            let result = response.await.map_err(Into::into);
            if let Some(deltas) = deltas {
                deltas.flush().await;
            }
            match result {
                Ok(mut response) => {
                    redactor.redact_message(&mut response.message);
                    Ok(response)
                }
                Err(error) => Err(redactor.redact_error(error)),
            }
        })
    }
}

/// Masks streamed deltas before they reach the consumer's sink.
struct RedactedDeltas {
    inner: Arc<dyn DeltaSink>,
    redactor: Arc<Redactor>,
    /// The end of the text so far that could be the start of a secret: not masked nor forwarded
    /// yet.
    held: Mutex<String>,
    /// The same for the reasoning.
    held_reasoning: Mutex<String>,
}

impl RedactedDeltas {
    /// The text that can be forwarded now from `held` and `delta`, masked; keeps back what could
    /// start a secret.
    fn release(&self, held: &Mutex<String>, delta: &str) -> String {
        let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
        held.push_str(delta);
        let (ready, scanned) = self.redactor.mask(&held, true);
        held.drain(..scanned);
        ready
    }

    /// What `held` kept back, masked, once the call ended.
    fn rest(&self, held: &Mutex<String>) -> String {
        let rest = {
            let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::take(&mut *held)
        };
        if rest.is_empty() {
            rest
        } else {
            self.redactor.mask(&rest, false).0
        }
    }

    /// Forwards what was held back, once the call ended.
    async fn flush(&self) {
        let reasoning = self.rest(&self.held_reasoning);
        if !reasoning.is_empty() {
            self.inner.reasoning(reasoning).await;
        }
        let rest = self.rest(&self.held);
        if !rest.is_empty() {
            self.inner.delta(rest).await;
        }
    }
}

impl DeltaSink for RedactedDeltas {
    fn delta(&self, text: String) -> BoxFuture<'_, ()> {
        // Reasoning comes before the answer: what it held back goes out before the answer's text.
        let reasoning = self.rest(&self.held_reasoning);
        let ready = self.release(&self.held, &text);
        Box::pin(async move {
            if !reasoning.is_empty() {
                self.inner.reasoning(reasoning).await;
            }
            if !ready.is_empty() {
                self.inner.delta(ready).await;
            }
        })
    }

    fn reasoning(&self, text: String) -> BoxFuture<'_, ()> {
        let ready = self.release(&self.held_reasoning, &text);
        Box::pin(async move {
            if !ready.is_empty() {
                self.inner.reasoning(ready).await;
            }
        })
    }

    /// What was held back belongs to the discarded attempt: dropped, never forwarded.
    fn discard(&self, failure: Failure) -> BoxFuture<'_, ()> {
        for held in [&self.held, &self.held_reasoning] {
            held.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
        self.inner.discard(self.redactor.redact_failure(failure))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tower::ServiceExt;

    use super::super::testing::*;
    use super::*;
    use crate::protocol::message::ToolCall;
    use crate::protocol::FailureKind;

    fn redactor() -> Arc<Redactor> {
        Arc::new(
            Redactor::new(["s3cret42".to_string(), "s3cret42-long".to_string()])
                .expect("long enough"),
        )
    }

    #[test]
    fn text_without_secrets_is_left_alone() {
        assert_eq!(redactor().redact("nothing to see"), None);
        let nothing = Redactor::new([String::new()]).expect("an empty secret is ignored");
        assert!(nothing.is_empty());
        assert_eq!(nothing.redact("anything"), None);
    }

    #[test]
    fn the_longest_secret_at_a_position_is_masked_and_masks_are_not_masked_again() {
        let redactor = redactor();
        assert_eq!(
            redactor
                .redact("a s3cret42-long and a s3cret42, é s3cret42")
                .as_deref(),
            Some("a [redacted] and a [redacted], é [redacted]")
        );
        let inside_the_mask = Redactor::new(["redacted".to_string()]).expect("long enough");
        assert_eq!(
            inside_the_mask.redact("redacted").as_deref(),
            Some("[redacted]")
        );
    }

    #[test]
    fn masked_reasoning_loses_its_signature_and_untouched_reasoning_keeps_it() {
        let redactor = redactor();
        let signed = |reasoning: &str| Message {
            reasoning: Some(reasoning.to_owned()),
            reasoning_signature: Some("sig".to_owned()),
            ..Message::assistant("answer")
        };
        let mut leaked = signed("the key is s3cret42");
        redactor.redact_message(&mut leaked);
        assert_eq!(leaked.reasoning.as_deref(), Some("the key is [redacted]"));
        assert_eq!(
            leaked.reasoning_signature, None,
            "the signature covered other text"
        );
        let mut clean = signed("nothing secret");
        redactor.redact_message(&mut clean);
        assert_eq!(clean.reasoning_signature.as_deref(), Some("sig"));
    }

    #[test]
    fn a_secret_too_short_to_mask_safely_is_refused_and_not_shown() {
        // A key of one letter would turn `load_skill` into `load_s[redacted]ill`.
        for short in ["k", "é", "1234567", " "] {
            let refused = Redactor::new(["long-enough-secret".to_string(), short.to_string()])
                .expect_err(short);
            assert_eq!(refused, SecretTooShort { bytes: short.len() });
            assert!(
                refused.to_string().contains("at least 8 bytes"),
                "{refused}"
            );
        }
        let refused = Redactor::new(["1234567".to_string()]).expect_err("seven bytes");
        assert!(!refused.to_string().contains("1234567"), "{refused}");
        assert_eq!(
            Redactor::new(["k".to_string()])
                .expect_err("one letter")
                .to_string(),
            "a secret of 1 byte cannot be masked safely: every occurrence of it in answers and \
             tool output would be masked, inside ordinary words too; a secret must be at least \
             8 bytes"
        );
        let shortest = "x".repeat(MIN_SECRET_BYTES);
        let masked = Redactor::new([shortest.clone()]).expect("the shortest allowed");
        assert_eq!(
            masked.redact(&format!("key={shortest}")).as_deref(),
            Some("key=[redacted]")
        );
    }

    #[tokio::test]
    async fn tool_output_and_failure_messages_are_masked() {
        let inner = tower::service_fn(|request: ToolCallRequest| async move {
            Ok::<_, BoxError>(match request.call.name.as_str() {
                "env" => ok_result(&request.call.id, "TOKEN=s3cret42"),
                _ => failed_result(
                    &request.call.id,
                    FailureKind::ToolFailed,
                    "bad key s3cret42",
                ),
            })
        });
        let service = RedactLayer::new(redactor()).layer(inner);

        let ok = service
            .clone()
            .oneshot(tool_request("c1", "env"))
            .await
            .expect("tool result");
        let failed = service
            .oneshot(tool_request("c2", "login"))
            .await
            .expect("tool result");

        assert_eq!(ok.outcome.observation(), "TOKEN=[redacted]");
        assert_eq!(
            failed.outcome.observation(),
            "error (tool_failed): bad key [redacted]"
        );
    }

    #[tokio::test]
    async fn an_error_leaves_as_a_masked_failure() {
        let inner = tower::service_fn(|_: ToolCallRequest| async {
            Err::<ToolResult, BoxError>(Box::new(Failure::new(
                FailureKind::Unavailable,
                "upstream refused s3cret42",
            )))
        });

        let error = RedactLayer::new(redactor())
            .layer(inner)
            .oneshot(tool_request("c1", "fetch"))
            .await
            .expect_err("the inner error");

        let failure = error.downcast::<Failure>().expect("a failure");
        assert_eq!(failure.kind, FailureKind::Unavailable);
        assert_eq!(failure.message, "upstream refused [redacted]");
    }

    #[tokio::test]
    async fn model_text_arguments_and_deltas_are_masked_even_when_split() {
        let inner = tower::service_fn(|call: ModelCall| async move {
            if let Some(deltas) = &call.deltas {
                for piece in [
                    "the key is s3",
                    "cret42, the",
                    " other s3cret42-l",
                    "ong; s3",
                ] {
                    deltas.delta(piece.into()).await;
                }
            }
            let mut response = text_response("the key is s3cret42, the other s3cret42-long; s3");
            response.message.tool_calls.push(ToolCall {
                id: "c1".into(),
                name: "login".into(),
                arguments: json!({"password": "s3cret42", "tries": [1, "s3cret42"]}),
            });
            Ok::<_, BoxError>(response)
        });
        let sink = Arc::new(CollectedDeltas::default());

        let response = RedactLayer::new(redactor())
            .layer(inner)
            .oneshot(model_call(Some(sink.clone())))
            .await
            .expect("model response");

        let masked = "the key is [redacted], the other [redacted]; s3";
        assert_eq!(response.message.content, masked);
        assert_eq!(
            response.message.tool_calls[0].arguments,
            json!({"password": "[redacted]", "tries": [1, "[redacted]"]})
        );
        assert_eq!(sink.text(), masked);
        assert!(sink.pieces().iter().all(|piece| !piece.contains("s3c")));
    }

    #[tokio::test]
    async fn streamed_reasoning_is_masked_apart_from_the_text_and_stays_before_it() {
        let inner = tower::service_fn(|call: ModelCall| async move {
            if let Some(deltas) = &call.deltas {
                // The reasoning ends on what could start a secret; then the answer streams.
                for piece in ["I will use s3", "cret42 here, s3"] {
                    deltas.reasoning(piece.into()).await;
                }
                deltas.delta("done".into()).await;
            }
            let mut response = text_response("done");
            response.message.reasoning = Some("I will use s3cret42 here, s3".into());
            Ok::<_, BoxError>(response)
        });
        let sink = Arc::new(CollectedDeltas::default());

        let response = RedactLayer::new(redactor())
            .layer(inner)
            .oneshot(model_call(Some(sink.clone())))
            .await
            .expect("model response");

        let masked = "I will use [redacted] here, s3";
        assert_eq!(response.message.reasoning.as_deref(), Some(masked));
        let all = sink.all();
        let reasoning: String = all
            .iter()
            .filter(|(reasoning, _)| *reasoning)
            .map(|(_, piece)| piece.as_str())
            .collect();
        assert_eq!(reasoning, masked);
        assert!(
            all.iter().all(|(_, piece)| !piece.contains("s3c")),
            "{all:?}"
        );
        assert_eq!(
            all.last(),
            Some(&(false, "done".to_owned())),
            "the held-back reasoning goes out before the answer: {all:?}"
        );
    }

    #[tokio::test]
    async fn a_discard_drops_what_was_held_back_and_goes_on_masked() {
        /// Forwards text to `text` and keeps the failures of discards.
        #[derive(Default)]
        struct Sink {
            text: CollectedDeltas,
            discarded: std::sync::Mutex<Vec<Failure>>,
        }
        impl DeltaSink for Sink {
            fn delta(&self, text: String) -> BoxFuture<'_, ()> {
                self.text.delta(text)
            }
            fn discard(&self, failure: Failure) -> BoxFuture<'_, ()> {
                self.discarded.lock().expect("discarded").push(failure);
                Box::pin(futures::future::ready(()))
            }
        }
        let inner = tower::service_fn(|call: ModelCall| async move {
            let deltas = call.deltas.expect("streamed");
            // The attempt breaks off on what could start a secret, then the call is made again.
            deltas.delta("partial s3".into()).await;
            let broke = Failure::new(FailureKind::ModelFailed, "stream broke near s3cret42");
            deltas.discard(broke).await;
            deltas.delta("good".into()).await;
            Ok::<_, BoxError>(text_response("good"))
        });
        let sink = Arc::new(Sink::default());

        RedactLayer::new(redactor())
            .layer(inner)
            .oneshot(model_call(Some(sink.clone())))
            .await
            .expect("model response");

        assert_eq!(sink.text.text(), "partial good");
        let discarded = sink.discarded.lock().expect("discarded").clone();
        assert_eq!(discarded.len(), 1);
        assert_eq!(discarded[0].message, "stream broke near [redacted]");
    }
}

#[cfg(test)]
mod process_secrets {
    use tower::ServiceExt;

    use super::SecretTooShort;
    use crate::agent::middleware::testing::{ok_result, tool_request};
    use crate::agent::middleware::{BuiltinConfig, Middleware, MiddlewareError};
    use crate::agent::seams::{BoxError, ToolCallRequest};

    #[tokio::test]
    async fn a_process_secret_added_to_the_middleware_is_masked() {
        let inner = tower::service_fn(|request: ToolCallRequest| async move {
            Ok::<_, BoxError>(ok_result(&request.call.id, "key=sk-live-123"))
        });
        let plain = Middleware::new().wrap_tools(inner);
        let unmasked = plain
            .oneshot(tool_request("c1", "env"))
            .await
            .expect("result");
        assert_eq!(unmasked.outcome.observation(), "key=sk-live-123");

        let guarded = Middleware::new()
            .with_secrets(["sk-live-123".to_string(), String::new()])
            .expect("long enough")
            .wrap_tools(inner);
        let masked = guarded
            .oneshot(tool_request("c1", "env"))
            .await
            .expect("result");
        assert_eq!(masked.outcome.observation(), "key=[redacted]");
    }

    #[test]
    fn a_process_secret_too_short_to_mask_is_refused() {
        let refused = Middleware::new().with_secrets(["k".to_string()]);
        assert!(
            matches!(
                refused,
                Err(MiddlewareError::SecretTooShort(SecretTooShort { bytes: 1 }))
            ),
            "a one-letter key is refused"
        );
        let refused = Middleware::new().builtins(BuiltinConfig {
            secrets: vec!["k".into()],
            ..BuiltinConfig::default()
        });
        assert!(refused.is_err(), "and so in the built-ins' configuration");
    }
}
