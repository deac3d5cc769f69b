//! An embedder's lead: the standard lead with one middleware of its own, a tool layer that refuses
//! any call whose arguments mention a blocked word (say, a production host name). The refusal is
//! an observation the model sees (`denied`); the call never reaches a worker.
//!
//! `skein_lead::LeadBuilder` takes a `Middleware`; a layer added there runs outside the built-in
//! layers (logging, redaction, concurrency limits, retries), around every tool call of every turn.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use skein_common::agent::middleware::Middleware;
use skein_common::agent::seams::ToolCallRequest;
use skein_common::protocol::{CallOutcome, Failure, FailureKind, ToolResult, PROTOCOL_VERSION};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service};

/// The environment variable naming the blocked word.
pub const ENV_BLOCKED_WORD: &str = "SKEIN_BLOCKED_WORD";

/// Refuses tool calls whose arguments contain `word`.
#[derive(Debug, Clone)]
pub struct BlockWordLayer {
    word: String,
}

impl BlockWordLayer {
    pub fn new(word: impl Into<String>) -> Self {
        Self { word: word.into() }
    }
}

impl<S> Layer<S> for BlockWordLayer {
    type Service = BlockWord<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BlockWord {
            inner,
            word: self.word.clone(),
        }
    }
}

/// The service [`BlockWordLayer`] builds.
#[derive(Debug, Clone)]
pub struct BlockWord<S> {
    inner: S,
    word: String,
}

impl<S> Service<ToolCallRequest> for BlockWord<S>
where
    S: Service<ToolCallRequest, Response = ToolResult>,
    S::Future: Send + 'static,
{
    type Response = ToolResult;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<ToolResult, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ToolCallRequest) -> Self::Future {
        if !self.word.is_empty() && request.call.arguments.to_string().contains(&self.word) {
            let failure = Failure::new(
                FailureKind::Denied,
                format!(
                    "blocked by the guarded lead: the arguments of {} mention {:?}",
                    request.call.name, self.word
                ),
            );
            let result = ToolResult {
                v: PROTOCOL_VERSION,
                call_id: request.call.id,
                outcome: CallOutcome::Failed { failure },
                worker_id: String::new(),
                duration_ms: 0,
                attempts: 0,
            };
            return Box::pin(async move { Ok(result) });
        }
        Box::pin(self.inner.call(request))
    }
}

/// The guarded lead's middleware.
pub fn middleware(blocked_word: &str) -> Middleware {
    Middleware::new().tool_layer(BlockWordLayer::new(blocked_word))
}

/// Runs the guarded lead until `shutdown` is cancelled.
pub async fn run(
    cfg: skein_lead::Config,
    blocked_word: &str,
    shutdown: CancellationToken,
) -> Result<(), skein_lead::LeadError> {
    skein_lead::LeadBuilder::new(cfg)
        .middleware(middleware(blocked_word))
        .run(shutdown)
        .await
}
