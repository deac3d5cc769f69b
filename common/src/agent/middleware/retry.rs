//! Retries of transient failures, on tower's `Retry` and `ExponentialBackoff`.
//!
//! Invariants:
//! - a model call is tried again only when its error is transient: a
//!   [`Failure`] marked `retryable` (429, 5xx, unreachable, timed out, a stream cut short or
//!   ended by the server's error) or a timeout layer's `Elapsed`; also after some of its text or
//!   reasoning was streamed, under the same attempts and waits: the consumer's sink is then told
//!   to drop what the failed attempt streamed ([`DeltaSink::discard`]) before the next attempt
//!   streams anything, so what it sees after the last discard is one attempt's output;
//! - a tool call is tried again only when it failed `unavailable` and `retryable` (it never
//!   reached a tool); a `timed_out` call is never tried again, it may still run. The next attempt
//!   is marked `may_have_run`, so the tool service looks for a recorded result before running it;
//! - `attempts` counts every attempt, the first included; the delays grow exponentially from the
//!   configured base (see [`RetryConfig`]), on `tokio::time`;
//! - a model failure that carries the server's `Retry-After` (a 429 or 503) waits that long
//!   instead, at most [`LONGEST_RETRY_AFTER`], and such waits do not use up `attempts` (at most
//!   [`RETRY_AFTER_WAITS`] of them per call): being asked to wait costs a call time, not its
//!   answer;
//! - no model retry waits past the deadline of the task the call serves: the failure is returned
//!   instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tower::retry::backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::retry::{Policy, Retry};
use tower::util::rng::HasherRng;
use tower::{Layer, Service, ServiceExt};

use super::config::{MiddlewareError, RetryConfig};
use crate::agent::model::ModelResponse;
use crate::agent::seams::{BoxError, DeltaSink, ModelCall, ToolCallRequest};
use crate::protocol::{CallOutcome, Failure, FailureKind, ToolResult};

/// Part of each delay added at random, so callers that failed together do not retry together.
const JITTER: f64 = 0.5;

/// The longest `Retry-After` a model call waits out; a longer one is cut to this.
pub const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The most `Retry-After` waits one model call makes, on top of its attempts.
pub const RETRY_AFTER_WAITS: u32 = 10;

fn backoff_maker(
    service: &'static str,
    config: &RetryConfig,
) -> Result<ExponentialBackoffMaker, MiddlewareError> {
    ExponentialBackoffMaker::new(
        config.base_delay,
        config.max_delay,
        JITTER,
        HasherRng::default(),
    )
    .map_err(|source| MiddlewareError::InvalidBackoff { service, source })
}

/// Retries transient model failures; see the module's invariants.
#[derive(Debug, Clone)]
pub struct ModelRetryLayer {
    attempts: u32,
    backoff: ExponentialBackoffMaker,
}

impl ModelRetryLayer {
    /// `None` when `config` turns retrying off.
    pub fn new(config: &RetryConfig) -> Result<Option<Self>, MiddlewareError> {
        if config.attempts == 0 {
            return Err(MiddlewareError::NoAttempts { service: "model" });
        }
        if !config.is_on() {
            return Ok(None);
        }
        Ok(Some(Self {
            attempts: config.attempts,
            backoff: backoff_maker("model", config)?,
        }))
    }
}

impl<S> Layer<S> for ModelRetryLayer {
    type Service = ModelRetry<S>;

    fn layer(&self, inner: S) -> ModelRetry<S> {
        ModelRetry {
            inner,
            attempts: self.attempts,
            backoff: self.backoff.clone(),
        }
    }
}

/// The service of [`ModelRetryLayer`]: tower's `Retry`, set up per call so it can see whether the
/// call streamed anything.
#[derive(Debug, Clone)]
pub struct ModelRetry<S> {
    inner: S,
    attempts: u32,
    backoff: ExponentialBackoffMaker,
}

impl<S> Service<ModelCall> for ModelRetry<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + 'static,
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
        let streamed = Arc::new(AtomicBool::new(false));
        let consumer = call.deltas.take();
        if let Some(sink) = &consumer {
            call.deltas = Some(Arc::new(WatchedDeltas {
                inner: sink.clone(),
                streamed: streamed.clone(),
            }));
        }
        let policy = ModelRetryPolicy {
            retries_left: self.attempts.saturating_sub(1),
            waits_left: RETRY_AFTER_WAITS,
            backoff: self.backoff.make_backoff(),
            streamed,
            consumer,
            deadline: call
                .origin
                .as_ref()
                .and_then(|origin| origin.deadline_ms)
                .map(deadline_instant),
        };
        let ready = super::take_ready(&mut self.inner);
        let retry = Retry::new(policy, ready.map_err(Into::<BoxError>::into));
        Box::pin(retry.oneshot(call))
    }
}

/// Notes that a call streamed text or reasoning, on its way to the consumer's sink.
struct WatchedDeltas {
    inner: Arc<dyn DeltaSink>,
    streamed: Arc<AtomicBool>,
}

impl DeltaSink for WatchedDeltas {
    fn delta(&self, text: String) -> BoxFuture<'_, ()> {
        self.streamed.store(true, Ordering::Release);
        self.inner.delta(text)
    }

    /// Reasoning already shown counts as streamed output: a retry discards it too.
    fn reasoning(&self, text: String) -> BoxFuture<'_, ()> {
        self.streamed.store(true, Ordering::Release);
        self.inner.reasoning(text)
    }

    /// A layer inside this one discarded what streamed so far: nothing of it is left to drop.
    fn discard(&self, failure: Failure) -> BoxFuture<'_, ()> {
        self.streamed.store(false, Ordering::Release);
        self.inner.discard(failure)
    }
}

/// A task deadline (ms since the Unix epoch) on `tokio::time`'s clock.
fn deadline_instant(deadline_ms: u64) -> tokio::time::Instant {
    let left = deadline_ms.saturating_sub(crate::protocol::now_ms());
    tokio::time::Instant::now() + Duration::from_millis(left)
}

#[derive(Clone)]
struct ModelRetryPolicy {
    retries_left: u32,
    /// `Retry-After` waits left.
    waits_left: u32,
    backoff: ExponentialBackoff,
    /// Whether the attempt under way streamed anything to the consumer.
    streamed: Arc<AtomicBool>,
    /// The consumer's sink, told to drop a failed attempt's output before the call is retried.
    consumer: Option<Arc<dyn DeltaSink>>,
    /// The task's deadline: no retry waits past it.
    deadline: Option<tokio::time::Instant>,
}

impl ModelRetryPolicy {
    /// Whether a wait ending at `wake` leaves time before the deadline.
    fn ends_in_time(&self, wake: tokio::time::Instant) -> bool {
        self.deadline.is_none_or(|deadline| wake < deadline)
    }
}

impl Policy<ModelCall, ModelResponse, BoxError> for ModelRetryPolicy {
    type Future = BoxFuture<'static, ()>;

    fn retry(
        &mut self,
        _: &mut ModelCall,
        result: &mut Result<ModelResponse, BoxError>,
    ) -> Option<Self::Future> {
        let Err(error) = result else { return None };
        let wait = self.wait_before_retry(error)?;
        // Reset before the next attempt can stream: what it streams is its own.
        let streamed = self.streamed.swap(false, Ordering::AcqRel);
        let discard = streamed.then(|| self.consumer.clone()).flatten();
        let Some(consumer) = discard else {
            return Some(Box::pin(wait));
        };
        let failure = failure_of(error);
        tracing::debug!(
            error.kind = failure.kind.as_str(),
            "model call failed after it streamed; its output is discarded"
        );
        Some(Box::pin(async move {
            consumer.discard(failure).await;
            wait.await;
        }))
    }

    fn clone_request(&mut self, call: &ModelCall) -> Option<ModelCall> {
        (self.retries_left > 0 || self.waits_left > 0).then(|| call.clone())
    }
}

impl ModelRetryPolicy {
    /// The wait before the next attempt after `error`, or `None` when the call is not tried
    /// again (not transient, attempts or waits used up, the deadline too near).
    fn wait_before_retry(&mut self, error: &BoxError) -> Option<tokio::time::Sleep> {
        if !is_transient_model_error(error) {
            return None;
        }
        let asked_to_wait = error
            .downcast_ref::<Failure>()
            .and_then(crate::agent::model::retry_after);
        if let Some(wait) = asked_to_wait.filter(|_| self.waits_left > 0) {
            let wait = wait.min(LONGEST_RETRY_AFTER);
            let wake = tokio::time::Instant::now() + wait;
            if !self.ends_in_time(wake) {
                return None;
            }
            self.waits_left -= 1;
            tracing::debug!(
                wait_ms = wait.as_millis() as u64,
                waits_left = self.waits_left,
                "model server asked to wait, trying again after it"
            );
            return Some(tokio::time::sleep_until(wake));
        }
        if self.retries_left == 0 {
            return None;
        }
        let backoff = self.backoff.next_backoff();
        if !self.ends_in_time(backoff.deadline()) {
            return None;
        }
        self.retries_left -= 1;
        tracing::debug!(
            retries_left = self.retries_left,
            error.kind = error_kind(error),
            "model call failed, trying again"
        );
        Some(backoff)
    }
}

/// The failure an error stands for, as the consumer is told it.
fn failure_of(error: &BoxError) -> Failure {
    match error.downcast_ref::<Failure>() {
        Some(failure) => failure.clone(),
        None => Failure {
            retryable: true,
            ..Failure::new(FailureKind::TimedOut, "the model call timed out")
        },
    }
}

fn is_transient_model_error(error: &BoxError) -> bool {
    if let Some(failure) = error.downcast_ref::<Failure>() {
        return failure.retryable;
    }
    error.is::<tower::timeout::error::Elapsed>()
}

/// The failure kind an error stands for, for logs.
pub(super) fn error_kind(error: &BoxError) -> &'static str {
    if let Some(failure) = error.downcast_ref::<Failure>() {
        return failure.kind.as_str();
    }
    if error.is::<tower::timeout::error::Elapsed>() {
        return FailureKind::TimedOut.as_str();
    }
    FailureKind::Internal.as_str()
}

/// The retry policy of tool calls, for `tower::retry::RetryLayer`; see the module's invariants.
#[derive(Debug, Clone)]
pub struct ToolRetryPolicy {
    retries_left: u32,
    backoff: ExponentialBackoff,
}

impl ToolRetryPolicy {
    /// `None` when `config` turns retrying off.
    pub fn new(config: &RetryConfig) -> Result<Option<Self>, MiddlewareError> {
        if config.attempts == 0 {
            return Err(MiddlewareError::NoAttempts { service: "tool" });
        }
        if !config.is_on() {
            return Ok(None);
        }
        Ok(Some(Self {
            retries_left: config.attempts - 1,
            backoff: backoff_maker("tool", config)?.make_backoff(),
        }))
    }
}

impl Policy<ToolCallRequest, ToolResult, BoxError> for ToolRetryPolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        request: &mut ToolCallRequest,
        result: &mut Result<ToolResult, BoxError>,
    ) -> Option<Self::Future> {
        let failure = match result {
            Ok(ToolResult {
                outcome: CallOutcome::Failed { failure },
                ..
            }) => failure,
            Ok(_) => return None,
            Err(error) => error.downcast_ref::<Failure>()?,
        };
        if self.retries_left == 0 || !never_reached_a_tool(failure) {
            return None;
        }
        self.retries_left -= 1;
        request.may_have_run = true;
        tracing::debug!(
            tool = %request.call.name,
            call_id = %request.call.id,
            retries_left = self.retries_left,
            "tool call unavailable, trying again"
        );
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, request: &ToolCallRequest) -> Option<ToolCallRequest> {
        (self.retries_left > 0).then(|| request.clone())
    }
}

fn never_reached_a_tool(failure: &Failure) -> bool {
    failure.kind == FailureKind::Unavailable && failure.retryable
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;
    use std::time::Duration;

    use tower::retry::RetryLayer;

    use super::super::testing::*;
    use super::*;
    use crate::agent::seams::failure_from_error;
    use crate::protocol::TaskOrigin;

    fn retry_config(attempts: u32) -> RetryConfig {
        RetryConfig {
            attempts,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        }
    }

    fn model_layer(attempts: u32) -> ModelRetryLayer {
        ModelRetryLayer::new(&retry_config(attempts))
            .expect("valid config")
            .expect("retrying is on")
    }

    /// An inner model service that fails with `failures` in turn, then answers.
    fn failing_model(
        failures: Vec<Failure>,
        calls: Arc<AtomicUsize>,
    ) -> impl Service<
        ModelCall,
        Response = ModelResponse,
        Error = BoxError,
        Future = BoxFuture<'static, Result<ModelResponse, BoxError>>,
    > + Clone {
        let failures = Arc::new(Mutex::new(failures));
        tower::service_fn(move |_: ModelCall| {
            let (failures, calls) = (failures.clone(), calls.clone());
            Box::pin(async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let next = {
                    let mut failures = failures.lock().expect("failures");
                    (!failures.is_empty()).then(|| failures.remove(0))
                };
                match next {
                    Some(failure) => Err(Box::new(failure) as BoxError),
                    None => Ok(text_response("answer")),
                }
            }) as BoxFuture<'static, _>
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_retryable_model_failure_is_tried_again_until_it_succeeds() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = failing_model(vec![unavailable(), rate_limited()], calls.clone());
        let started = tokio::time::Instant::now();

        let response = model_layer(3)
            .layer(inner)
            .oneshot(model_call(None))
            .await
            .expect("the third attempt answers");

        assert_eq!(response.message.content, "answer");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Paused time advances exactly by the backoff sleeps: at least base, then twice base.
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn every_attempt_of_a_model_call_shares_its_conversation_rather_than_copying_it() {
        let call = model_call(None);
        let conversation = Arc::as_ptr(&call.request.messages) as usize;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(vec![unavailable(), rate_limited()]));
        let inner = tower::service_fn({
            let seen = seen.clone();
            move |call: ModelCall| {
                let messages = Arc::as_ptr(&call.request.messages) as usize;
                seen.lock().expect("seen").push(messages);
                let failure = failures.lock().expect("failures").pop();
                Box::pin(async move {
                    match failure {
                        Some(failure) => Err(Box::new(failure) as BoxError),
                        None => Ok(text_response("answer")),
                    }
                }) as BoxFuture<'static, Result<ModelResponse, BoxError>>
            }
        });
        model_layer(3)
            .layer(inner)
            .oneshot(call)
            .await
            .expect("the third attempt answers");
        assert_eq!(*seen.lock().expect("seen"), [conversation; 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_model_failure_that_is_not_retryable_is_returned_at_once() {
        let calls = Arc::new(AtomicUsize::new(0));
        let refused = Failure::new(FailureKind::ModelFailed, "model server answered 400");
        let inner = failing_model(vec![refused.clone()], calls.clone());

        let error = model_layer(3)
            .layer(inner)
            .oneshot(model_call(None))
            .await
            .expect_err("not retried");

        assert_eq!(failure_from_error(error), refused);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn model_retries_stop_after_the_configured_attempts() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = failing_model(vec![unavailable(); 5], calls.clone());

        let error = model_layer(2)
            .layer(inner)
            .oneshot(model_call(None))
            .await
            .expect_err("both attempts fail");

        assert_eq!(failure_from_error(error).kind, FailureKind::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_is_waited_out_without_using_up_the_attempts() {
        let calls = Arc::new(AtomicUsize::new(0));
        let wait = Duration::from_secs(1);
        let inner = failing_model(vec![rate_limited_for(wait); 3], calls.clone());
        let started = tokio::time::Instant::now();

        let response = model_layer(2)
            .layer(inner)
            .oneshot(model_call(None))
            .await
            .expect("the call answers once the server stops refusing");

        assert_eq!(response.message.content, "answer");
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Paused time advances exactly by the waits the server asked for.
        assert_eq!(started.elapsed(), 3 * wait);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_retry_after_is_cut_to_the_longest_wait() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = failing_model(
            vec![rate_limited_for(Duration::from_secs(3600))],
            calls.clone(),
        );
        let started = tokio::time::Instant::now();

        model_layer(2)
            .layer(inner)
            .oneshot(model_call(None))
            .await
            .expect("the second attempt answers");

        assert_eq!(started.elapsed(), LONGEST_RETRY_AFTER);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn no_retry_waits_past_the_tasks_deadline() {
        for failure in [rate_limited_for(Duration::from_secs(30)), unavailable()] {
            let calls = Arc::new(AtomicUsize::new(0));
            let inner = failing_model(vec![failure.clone()], calls.clone());
            let mut call = model_call(None);
            call.origin = Some(Arc::new(TaskOrigin {
                deadline_ms: Some(crate::protocol::now_ms() + 100),
                ..origin()
            }));

            let error = model_layer(3)
                .layer(inner)
                .oneshot(call)
                .await
                .expect_err("no time is left for another attempt");

            assert_eq!(failure_from_error(error), failure);
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{failure}");
        }
    }

    #[test]
    fn the_wait_a_server_asked_for_survives_into_the_failure() {
        let wait = Duration::from_millis(2500);
        assert_eq!(
            crate::agent::model::retry_after(&rate_limited_for(wait)),
            Some(wait)
        );
        assert_eq!(crate::agent::model::retry_after(&rate_limited()), None);
        assert_eq!(crate::agent::model::retry_after(&unavailable()), None);
    }

    /// What a sink was told, in order.
    #[derive(Debug, Clone, PartialEq)]
    enum Told {
        Text(String),
        Reasoning(String),
        Discard(Failure),
    }

    #[derive(Default)]
    struct ToldSink(Mutex<Vec<Told>>);

    impl ToldSink {
        fn told(&self) -> Vec<Told> {
            self.0.lock().expect("told").clone()
        }
    }

    impl DeltaSink for ToldSink {
        fn delta(&self, text: String) -> BoxFuture<'_, ()> {
            self.0.lock().expect("told").push(Told::Text(text));
            Box::pin(futures::future::ready(()))
        }

        fn reasoning(&self, text: String) -> BoxFuture<'_, ()> {
            self.0.lock().expect("told").push(Told::Reasoning(text));
            Box::pin(futures::future::ready(()))
        }

        fn discard(&self, failure: Failure) -> BoxFuture<'_, ()> {
            self.0.lock().expect("told").push(Told::Discard(failure));
            Box::pin(futures::future::ready(()))
        }
    }

    /// One scripted attempt: what it streams (`true` for reasoning), then how it ends.
    type Attempt = (Vec<(bool, &'static str)>, Result<&'static str, Failure>);

    /// An inner model service that plays `attempts` in turn, streaming to the call's sink.
    fn streaming_model(
        attempts: Vec<Attempt>,
        calls: Arc<AtomicUsize>,
    ) -> impl Service<
        ModelCall,
        Response = ModelResponse,
        Error = BoxError,
        Future = BoxFuture<'static, Result<ModelResponse, BoxError>>,
    > + Clone {
        let attempts = Arc::new(Mutex::new(attempts));
        tower::service_fn(move |call: ModelCall| {
            let (attempts, calls) = (attempts.clone(), calls.clone());
            Box::pin(async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let (streams, end) = attempts.lock().expect("attempts").remove(0);
                let sink = call.deltas.expect("the call streams");
                for (reasoning, piece) in streams {
                    if reasoning {
                        sink.reasoning(piece.to_owned()).await;
                    } else {
                        sink.delta(piece.to_owned()).await;
                    }
                }
                end.map(text_response)
                    .map_err(|failure| Box::new(failure) as BoxError)
            }) as BoxFuture<'static, _>
        })
    }

    /// A stream the server ended with an error after its first tokens (OpenRouter's mid-stream
    /// `error` chunk), as the provider reports it.
    fn broke_off() -> Failure {
        Failure {
            kind: FailureKind::ModelFailed,
            message: "model server error: Provider disconnected unexpectedly".into(),
            retryable: true,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_broke_off_after_streaming_is_discarded_and_tried_again() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = streaming_model(
            vec![
                (
                    vec![(true, "thinking"), (false, "The answer is")],
                    Err(broke_off()),
                ),
                (vec![(false, "42.")], Ok("42.")),
            ],
            calls.clone(),
        );
        let sink = Arc::new(ToldSink::default());

        let response = model_layer(3)
            .layer(inner)
            .oneshot(model_call(Some(sink.clone())))
            .await
            .expect("the second attempt answers");

        assert_eq!(response.message.content, "42.");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(
            sink.told(),
            [
                Told::Reasoning("thinking".into()),
                Told::Text("The answer is".into()),
                Told::Discard(broke_off()),
                Told::Text("42.".into()),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_discarded_attempt_uses_up_an_attempt_and_waits_out_the_backoff() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = streaming_model(
            vec![
                (vec![(false, "one")], Err(broke_off())),
                (vec![(false, "two")], Err(broke_off())),
                (vec![(false, "three")], Ok("three")),
            ],
            calls.clone(),
        );
        let sink = Arc::new(ToldSink::default());
        let started = tokio::time::Instant::now();

        let error = model_layer(2)
            .layer(inner)
            .oneshot(model_call(Some(sink.clone())))
            .await
            .expect_err("two attempts, both broke off");

        assert_eq!(failure_from_error(error), broke_off());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // The last attempt's output is not discarded: no attempt follows it.
        assert_eq!(
            sink.told(),
            [
                Told::Text("one".into()),
                Told::Discard(broke_off()),
                Told::Text("two".into()),
            ]
        );
        // Paused time advances exactly by the backoff: at least its base.
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_streamed_and_failed_for_good_is_not_tried_again() {
        let calls = Arc::new(AtomicUsize::new(0));
        let refused = Failure::new(FailureKind::ModelFailed, "model server answered 400");
        let inner = streaming_model(
            vec![
                (vec![(false, "partial")], Err(refused.clone())),
                (vec![(false, "never")], Ok("never")),
            ],
            calls.clone(),
        );
        let sink = Arc::new(ToldSink::default());

        let error = model_layer(3)
            .layer(inner)
            .oneshot(model_call(Some(sink.clone())))
            .await
            .expect_err("not retried");

        assert_eq!(failure_from_error(error), refused);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(sink.told(), [Told::Text("partial".into())]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_of_a_call_that_streamed_nothing_discards_nothing() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = streaming_model(
            vec![
                (vec![], Err(unavailable())),
                (vec![(false, "answer")], Ok("answer")),
            ],
            calls.clone(),
        );
        let sink = Arc::new(ToldSink::default());

        model_layer(3)
            .layer(inner)
            .oneshot(model_call(Some(sink.clone())))
            .await
            .expect("the second attempt answers");

        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(sink.told(), [Told::Text("answer".into())]);
    }

    /// An inner tool service that answers `replies` in turn and keeps the requests it got.
    fn scripted_tool(
        replies: Vec<ToolResult>,
        seen: Arc<Mutex<Vec<ToolCallRequest>>>,
    ) -> impl Service<
        ToolCallRequest,
        Response = ToolResult,
        Error = BoxError,
        Future = BoxFuture<'static, Result<ToolResult, BoxError>>,
    > + Clone {
        let replies = Arc::new(Mutex::new(replies));
        tower::service_fn(move |request: ToolCallRequest| {
            let (replies, seen) = (replies.clone(), seen.clone());
            Box::pin(async move {
                seen.lock().expect("seen").push(request);
                Ok(replies.lock().expect("replies").remove(0))
            }) as BoxFuture<'static, _>
        })
    }

    fn tool_retry(attempts: u32) -> RetryLayer<ToolRetryPolicy> {
        RetryLayer::new(
            ToolRetryPolicy::new(&retry_config(attempts))
                .expect("valid config")
                .expect("retrying is on"),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_tool_call_is_tried_again_marked_as_may_have_run() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let inner = scripted_tool(
            vec![
                failed_result("c1", FailureKind::Unavailable, "no worker answered"),
                ok_result("c1", "done"),
            ],
            seen.clone(),
        );

        let result = tool_retry(3)
            .layer(inner)
            .oneshot(tool_request("c1", "write"))
            .await
            .expect("tool result");

        assert!(result.outcome.is_ok());
        let seen = seen.lock().expect("seen");
        assert_eq!(seen.len(), 2);
        assert!(!seen[0].may_have_run);
        assert!(seen[1].may_have_run);
    }

    #[tokio::test(start_paused = true)]
    async fn timed_out_and_failed_tool_calls_are_not_tried_again() {
        for kind in [FailureKind::TimedOut, FailureKind::ToolFailed] {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let mut failed = failed_result("c1", kind, "no luck");
            if let CallOutcome::Failed { failure } = &mut failed.outcome {
                failure.retryable = true;
            }
            let inner = scripted_tool(vec![failed.clone(), ok_result("c1", "done")], seen.clone());

            let result = tool_retry(3)
                .layer(inner)
                .oneshot(tool_request("c1", "write"))
                .await
                .expect("tool result");

            assert_eq!(result, failed, "{kind:?}");
            assert_eq!(seen.lock().expect("seen").len(), 1, "{kind:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_tool_service_error_is_tried_again() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let inner = tower::service_fn(move |request: ToolCallRequest| {
            let calls = counted.clone();
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err::<ToolResult, BoxError>(Box::new(unavailable()));
                }
                Ok(ok_result(&request.call.id, "done"))
            }
        });

        let result = tool_retry(2)
            .layer(inner)
            .oneshot(tool_request("c1", "write"))
            .await
            .expect("tool result");

        assert!(result.outcome.is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn retrying_off_builds_no_layer() {
        assert!(ModelRetryLayer::new(&RetryConfig::off())
            .expect("valid")
            .is_none());
        assert!(ToolRetryPolicy::new(&RetryConfig::off())
            .expect("valid")
            .is_none());
    }
}
