//! One `debug` line per model or tool call: what was called, how long it took, how it ended.
//!
//! Invariants: the line is written when the call ends, with its outcome as a failure kind
//! (`ok` for success); it never carries arguments, output or messages, so it cannot leak what
//! redaction would mask. The layer changes nothing it passes on.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::retry::error_kind;
use crate::agent::model::ModelResponse;
use crate::agent::seams::{BoxError, ModelCall, ToolCallRequest};
use crate::protocol::{CallOutcome, ToolResult};

/// Logs each call; see the module's invariants.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogLayer;

impl<S> Layer<S> for LogLayer {
    type Service = Log<S>;

    fn layer(&self, inner: S) -> Log<S> {
        Log { inner }
    }
}

/// The service of [`LogLayer`].
#[derive(Debug, Clone)]
pub struct Log<S> {
    inner: S,
}

impl<S> Service<ToolCallRequest> for Log<S>
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
        let (tool, call_id, step) = (
            request.call.name.clone(),
            request.call.id.clone(),
            request.step,
        );
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await.map_err(Into::into);
            let outcome = match &result {
                Ok(ToolResult {
                    outcome: CallOutcome::Ok { .. },
                    ..
                }) => "ok",
                Ok(ToolResult {
                    outcome: CallOutcome::Failed { failure },
                    ..
                }) => failure.kind.as_str(),
                Err(error) => error_kind(error),
            };
            tracing::debug!(
                %tool,
                %call_id,
                step,
                elapsed_ms = started.elapsed().as_millis() as u64,
                %outcome,
                "tool call"
            );
            result
        })
    }
}

impl<S> Service<ModelCall> for Log<S>
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

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let (model, agent) = (call.request.model.clone(), call.request.agent.clone());
        let streamed = call.deltas.is_some();
        let started = Instant::now();
        let response = self.inner.call(call);
        Box::pin(async move {
            let result = response.await.map_err(Into::into);
            let (outcome, tool_calls) = match &result {
                Ok(response) => ("ok", response.message.tool_calls.len()),
                Err(error) => (error_kind(error), 0),
            };
            tracing::debug!(
                %model,
                %agent,
                streamed,
                elapsed_ms = started.elapsed().as_millis() as u64,
                %outcome,
                tool_calls,
                "model call"
            );
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tower::ServiceExt;

    use super::super::testing::*;
    use super::*;
    use crate::protocol::FailureKind;

    /// Collects what a test subscriber writes.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lines").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("lines")).into_owned()
        }
    }

    /// Makes `call` until it writes a line, and checks it wrote exactly one. A test on another
    /// thread that sets or rebuilds its own subscriber at the same moment can leave the global
    /// level hint at its `info` (tracing's callsite registry is process-wide), and a `debug` line
    /// is then dropped before any subscriber sees it: the call is made again, the callsites'
    /// interest asked anew, while its line was dropped that way. A call that logs two lines, or
    /// never one, still fails.
    async fn logged_once<F, C>(lines: &Lines, what: &str, mut call: C)
    where
        C: FnMut() -> F,
        F: std::future::Future<Output = ()>,
    {
        let before = lines.text().lines().count();
        let mut logged = 0;
        for _ in 0..50 {
            tracing::callsite::rebuild_interest_cache();
            call().await;
            logged = lines.text().lines().count() - before;
            if logged > 0 {
                break;
            }
        }
        assert_eq!(logged, 1, "{what}: {}", lines.text());
    }

    #[tokio::test]
    async fn one_line_per_call_with_its_outcome_and_nothing_it_carried() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let tools = LogLayer.layer(tower::service_fn(|request: ToolCallRequest| async move {
            Ok::<_, BoxError>(failed_result(
                &request.call.id,
                FailureKind::Denied,
                "not in /etc/passwd",
            ))
        }));
        let model = LogLayer.layer(tower::service_fn(|_: ModelCall| async {
            Ok::<_, BoxError>(text_response("private answer"))
        }));

        logged_once(&lines, "tool call", || {
            let tools = tools.clone();
            async move {
                tools
                    .oneshot(tool_request("c7", "read"))
                    .await
                    .expect("tool result");
            }
        })
        .await;
        logged_once(&lines, "model call", || {
            let model = model.clone();
            async move {
                model
                    .oneshot(model_call(None))
                    .await
                    .expect("model response");
            }
        })
        .await;
        let text = lines.text();
        let logged: Vec<&str> = text.lines().collect();
        assert_eq!(logged.len(), 2, "{text}");
        assert!(logged[0].contains("tool call"), "{text}");
        assert!(
            logged[0].contains("tool=read") && logged[0].contains("call_id=c7"),
            "{text}"
        );
        assert!(logged[0].contains("outcome=denied"), "{text}");
        assert!(
            logged[1].contains("model call") && logged[1].contains("outcome=ok"),
            "{text}"
        );
        assert!(
            !text.contains("passwd") && !text.contains("private"),
            "{text}"
        );
    }
}
