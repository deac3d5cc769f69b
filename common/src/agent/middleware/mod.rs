//! Middleware of the agent runtime: an onion of `tower` layers around the model service and the
//! tool service, hooks around the turn, each reasoning step and each acting step, and the chain of
//! system-prompt transformers. [`Middleware`] collects all of them and builds the two boxed
//! services the runtime clones per call.
//!
//! # Order
//!
//! Layers wrap the inner service like an onion, outermost first:
//!
//! ```text
//! model: user layers (first added outermost) → log → redact → retry → concurrency limit → timeout → inner
//! tools: user layers (first added outermost) → log → redact → retry → concurrency limit → inner
//! ```
//!
//! A cluster runtime's inner model service is itself the provider behind the spending budgets
//! ([`budget`]) and the cluster-wide traffic limits ([`limits`]), both placed by
//! `crate::wiring::assemble`: each attempt reserves its worst case on its task's and tenant's
//! budgets, then takes a slot of the model shared through Redis, so waiting out a backoff or a
//! `Retry-After` holds neither.
//!
//! Invariants:
//! - of the layers added with [`Middleware::model_layer`] / [`Middleware::tool_layer`], the first
//!   added is the outermost: it sees a call first and its response last;
//! - every user layer runs outside every built-in: it sees one call per call of the runtime (the
//!   retries happen inside it), responses already redacted, and errors already redacted into
//!   [`Failure`](crate::protocol::Failure)s when redaction is on;
//! - among the built-ins, the log line covers the whole call (all its attempts); retries happen
//!   outside the concurrency limit, so a call waiting out its backoff holds no permit; the model
//!   timeout bounds each attempt, not the wait for a permit;
//! - a built-in that is off is absent (no pass-through layer);
//! - the built services are `Clone`, and every clone shares the built-ins' state (the concurrency
//!   limits' semaphores): the runtime clones a service per call.
//!
//! Tool calls carry their own timeout (`ToolCallRequest::timeout`), enforced where the call runs
//! (the dispatcher, the worker), so there is no tool timeout layer here.
//!
//! Hooks ([`hooks`]) and prompt transformers ([`prompt`]) run in the order they were added; see
//! their modules for how a hook short-circuits a step.

pub mod budget;
pub mod config;
pub mod hooks;
pub mod limits;
pub mod logging;
pub mod prompt;
pub mod redact;
pub mod retry;
pub mod traffic_policy;

#[cfg(test)]
mod testing;

use std::sync::Arc;

use tower::limit::ConcurrencyLimitLayer;
use tower::retry::RetryLayer;
use tower::timeout::TimeoutLayer;
use tower::util::BoxCloneSyncService;
use tower::{Layer, Service, ServiceExt};

use crate::agent::model::ModelResponse;
use crate::agent::seams::{BoxError, ModelCall, ToolCallRequest};
use crate::protocol::ToolResult;

pub use budget::{BudgetSettings, ModelBudget, ModelBudgetLayer};
pub use config::{BuiltinConfig, MiddlewareError, RetryConfig};
pub use hooks::{HookChain, Stop, TurnContext, TurnHook, TurnSummary};
pub use limits::{ModelTraffic, ModelTrafficLayer, TrafficLimits};
pub use logging::{Log, LogLayer};
pub use prompt::{PromptChain, PromptTransformer};
pub use redact::{Redact, RedactLayer, Redactor, SecretTooShort, MIN_SECRET_BYTES, REDACTED};
pub use retry::{ModelRetry, ModelRetryLayer, ToolRetryPolicy};
pub use traffic_policy::{CallLimits, TrafficPolicy};

/// The tool service as the runtime holds it.
pub type ToolService = BoxCloneSyncService<ToolCallRequest, ToolResult, BoxError>;

/// The model service as the runtime holds it.
pub type ModelService = BoxCloneSyncService<ModelCall, ModelResponse, BoxError>;

/// A user layer, erased so the builder stays `Clone`.
type Wrap<S> = Arc<dyn Fn(S) -> S + Send + Sync>;

/// Everything that wraps the runtime's calls: layers around the model and tool services, the
/// built-in layers, the turn hooks and the prompt transformers.
#[derive(Clone)]
pub struct Middleware {
    builtins: Builtins,
    tool_layers: Vec<Wrap<ToolService>>,
    model_layers: Vec<Wrap<ModelService>>,
    hooks: HookChain,
    prompt: PromptChain,
}

impl Middleware {
    /// No user layers, hooks or transformers; the built-ins of [`BuiltinConfig::default`].
    pub fn new() -> Self {
        Self {
            builtins: Builtins::new(&BuiltinConfig::default())
                .expect("the default built-in configuration is valid"),
            tool_layers: Vec::new(),
            model_layers: Vec::new(),
            hooks: HookChain::default(),
            prompt: PromptChain::default(),
        }
    }

    /// Replaces the configuration of the built-in layers.
    pub fn builtins(mut self, config: BuiltinConfig) -> Result<Self, MiddlewareError> {
        self.builtins = Builtins::new(&config)?;
        Ok(self)
    }

    /// Adds secrets the redaction layer masks (the process's own credentials: a model API key
    /// must never reach a session's history, an event or a span). A secret too short to mask
    /// safely (shorter than [`redact::MIN_SECRET_BYTES`]) is refused.
    pub fn with_secrets(
        mut self,
        secrets: impl IntoIterator<Item = String>,
    ) -> Result<Self, MiddlewareError> {
        let before = self.builtins.config.secrets.len();
        let mut config = self.builtins.config.clone();
        config
            .secrets
            .extend(secrets.into_iter().filter(|s| !s.is_empty()));
        if config.secrets.len() > before {
            let redactor = Redactor::new(config.secrets.iter().cloned())?;
            self.builtins.redact = Some(RedactLayer::new(Arc::new(redactor)));
            self.builtins.config = config;
        }
        Ok(self)
    }

    /// The configuration of the built-in layers.
    pub fn builtin_config(&self) -> &BuiltinConfig {
        &self.builtins.config
    }

    /// Adds a layer around the tool service, inside the layers added before it and outside the
    /// built-ins.
    pub fn tool_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<ToolService> + Send + Sync + 'static,
        L::Service: Service<ToolCallRequest, Response = ToolResult> + Clone + Send + Sync + 'static,
        <L::Service as Service<ToolCallRequest>>::Error: Into<BoxError>,
        <L::Service as Service<ToolCallRequest>>::Future: Send + 'static,
    {
        self.tool_layers
            .push(Arc::new(move |inner| box_tools(layer.layer(inner))));
        self
    }

    /// Adds a layer around the model service, inside the layers added before it and outside the
    /// built-ins.
    pub fn model_layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<ModelService> + Send + Sync + 'static,
        L::Service: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
        <L::Service as Service<ModelCall>>::Error: Into<BoxError>,
        <L::Service as Service<ModelCall>>::Future: Send + 'static,
    {
        self.model_layers
            .push(Arc::new(move |inner| box_model(layer.layer(inner))));
        self
    }

    /// Adds a hook, inside the hooks added before it.
    pub fn hook(mut self, hook: Arc<dyn TurnHook>) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Adds a system-prompt transformer, applied after the ones added before it.
    pub fn prompt_transformer(mut self, transformer: PromptTransformer) -> Self {
        self.prompt.push(transformer);
        self
    }

    /// The turn hooks.
    pub fn hooks(&self) -> &HookChain {
        &self.hooks
    }

    /// The system-prompt transformers.
    pub fn prompt(&self) -> &PromptChain {
        &self.prompt
    }

    /// Wraps a tool service in the built-ins, then in the user layers (see the module's order).
    pub fn wrap_tools<S>(&self, inner: S) -> ToolService
    where
        S: Service<ToolCallRequest, Response = ToolResult> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        // Each step is boxed: one allocation per layer per call, nothing next to a tool call, and
        // the built-ins stay optional without a type per combination.
        let config = &self.builtins.config;
        let mut service = box_tools(inner);
        if let Some(limit) = config.tool_concurrency {
            service = box_tools(ConcurrencyLimitLayer::new(limit).layer(service));
        }
        if let Some(policy) = &self.builtins.tool_retry {
            service = box_tools(RetryLayer::new(policy.clone()).layer(service));
        }
        if let Some(redact) = &self.builtins.redact {
            service = box_tools(redact.layer(service));
        }
        if config.log {
            service = box_tools(LogLayer.layer(service));
        }
        self.tool_layers
            .iter()
            .rev()
            .fold(service, |service, wrap| wrap(service))
    }

    /// Wraps a model service in the built-ins, then in the user layers (see the module's order).
    pub fn wrap_model<S>(&self, inner: S) -> ModelService
    where
        S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        // Boxed at each step, as in `wrap_tools`.
        let config = &self.builtins.config;
        let mut service = box_model(inner);
        if let Some(timeout) = config.model_timeout {
            service = box_model(TimeoutLayer::new(timeout).layer(service));
        }
        if let Some(limit) = config.model_concurrency {
            service = box_model(ConcurrencyLimitLayer::new(limit).layer(service));
        }
        if let Some(retry) = &self.builtins.model_retry {
            service = box_model(retry.layer(service));
        }
        if let Some(redact) = &self.builtins.redact {
            service = box_model(redact.layer(service));
        }
        if config.log {
            service = box_model(LogLayer.layer(service));
        }
        self.model_layers
            .iter()
            .rev()
            .fold(service, |service, wrap| wrap(service))
    }
}

impl Default for Middleware {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Middleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Middleware")
            .field("builtins", &self.builtins.config)
            .field("tool_layers", &self.tool_layers.len())
            .field("model_layers", &self.model_layers.len())
            .field("hooks", &self.hooks.len())
            .field("prompt_transformers", &self.prompt.len())
            .finish()
    }
}

/// The built-in layers of a validated [`BuiltinConfig`]; `None` where a built-in is off.
#[derive(Clone)]
struct Builtins {
    config: BuiltinConfig,
    model_retry: Option<ModelRetryLayer>,
    tool_retry: Option<ToolRetryPolicy>,
    redact: Option<RedactLayer>,
}

impl Builtins {
    fn new(config: &BuiltinConfig) -> Result<Self, MiddlewareError> {
        config.validate()?;
        let redactor = Redactor::new(config.secrets.iter().cloned())?;
        Ok(Self {
            model_retry: ModelRetryLayer::new(&config.model_retry)?,
            tool_retry: ToolRetryPolicy::new(&config.tool_retry)?,
            redact: (!redactor.is_empty()).then(|| RedactLayer::new(Arc::new(redactor))),
            config: config.clone(),
        })
    }
}

/// The service `poll_ready` made ready, for the call about to be made, leaving a fresh clone in
/// its place for the next call (a clone of a ready service need not be ready itself).
pub(crate) fn take_ready<S: Clone>(service: &mut S) -> S {
    let fresh = service.clone();
    std::mem::replace(service, fresh)
}

fn box_tools<S>(service: S) -> ToolService
where
    S: Service<ToolCallRequest, Response = ToolResult> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    BoxCloneSyncService::new(service.map_err(Into::into))
}

fn box_model<S>(service: S) -> ModelService
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    BoxCloneSyncService::new(service.map_err(Into::into))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::testing::*;
    use super::*;
    use crate::agent::seams::failure_from_error;
    use crate::protocol::{CallOutcome, FailureKind};

    /// A user layer that records when a call passes it, and what comes back.
    #[derive(Clone)]
    struct Record {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl<S> Layer<S> for Record {
        type Service = Recorded<S>;
        fn layer(&self, inner: S) -> Recorded<S> {
            Recorded {
                record: self.clone(),
                inner,
            }
        }
    }

    #[derive(Clone)]
    struct Recorded<S> {
        record: Record,
        inner: S,
    }

    impl<S> Service<ToolCallRequest> for Recorded<S>
    where
        S: Service<ToolCallRequest, Response = ToolResult, Error = BoxError>,
        S::Future: Send + 'static,
    {
        type Response = ToolResult;
        type Error = BoxError;
        type Future = futures::future::BoxFuture<'static, Result<ToolResult, BoxError>>;

        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), BoxError>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, request: ToolCallRequest) -> Self::Future {
            push(&self.record.log, format!("{}>", self.record.name));
            let record = self.record.clone();
            let response = self.inner.call(request);
            Box::pin(async move {
                let result = response.await;
                let seen = match &result {
                    Ok(result) => result.outcome.observation(),
                    Err(error) => error.to_string(),
                };
                push(&record.log, format!("<{}: {seen}", record.name));
                result
            })
        }
    }

    impl<S> Service<ModelCall> for Recorded<S>
    where
        S: Service<ModelCall, Response = ModelResponse, Error = BoxError>,
        S::Future: Send + 'static,
    {
        type Response = ModelResponse;
        type Error = BoxError;
        type Future = futures::future::BoxFuture<'static, Result<ModelResponse, BoxError>>;

        fn poll_ready(
            &mut self,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), BoxError>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, call: ModelCall) -> Self::Future {
            push(&self.record.log, format!("{}>", self.record.name));
            let record = self.record.clone();
            let response = self.inner.call(call);
            Box::pin(async move {
                let result = response.await;
                let seen = match &result {
                    Ok(response) => response.message.content.clone(),
                    Err(error) => error.to_string(),
                };
                push(&record.log, format!("<{}: {seen}", record.name));
                result
            })
        }
    }

    fn push(log: &Mutex<Vec<String>>, entry: String) {
        log.lock().expect("test log").push(entry);
    }

    fn with_secret_and_retries() -> BuiltinConfig {
        BuiltinConfig {
            secrets: vec!["s3cret42".into()],
            tool_retry: RetryConfig {
                attempts: 2,
                ..RetryConfig::default()
            },
            ..BuiltinConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn first_tool_layer_is_outermost_and_user_layers_wrap_the_builtins() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let inner_log = log.clone();
        let replies = Arc::new(Mutex::new(vec![
            failed_result("c1", FailureKind::Unavailable, "no worker"),
            ok_result("c1", "token s3cret42"),
        ]));
        let inner = tower::service_fn(move |_: ToolCallRequest| {
            let (log, replies) = (inner_log.clone(), replies.clone());
            async move {
                push(&log, "inner".into());
                Ok::<_, BoxError>(replies.lock().expect("replies").remove(0))
            }
        });
        let middleware = Middleware::new()
            .builtins(with_secret_and_retries())
            .expect("valid config")
            .tool_layer(Record {
                name: "first",
                log: log.clone(),
            })
            .tool_layer(Record {
                name: "second",
                log: log.clone(),
            });

        let result = middleware
            .wrap_tools(inner)
            .oneshot(tool_request("c1", "read"))
            .await
            .expect("tool result");

        assert_eq!(result.outcome, CallOutcome::ok("token [redacted]"));
        // One pass through each user layer, two attempts inside them, the output already
        // redacted when the user layers see it.
        assert_eq!(
            *log.lock().expect("test log"),
            [
                "first>",
                "second>",
                "inner",
                "inner",
                "<second: token [redacted]",
                "<first: token [redacted]",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn first_model_layer_is_outermost_and_user_layers_wrap_the_builtins() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let inner_log = log.clone();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let inner = tower::service_fn(move |_: ModelCall| {
            let (log, calls) = (inner_log.clone(), counted.clone());
            async move {
                push(&log, "inner".into());
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err::<ModelResponse, BoxError>(Box::new(unavailable()));
                }
                Ok(text_response("the key is s3cret42"))
            }
        });
        let middleware = Middleware::new()
            .builtins(with_secret_and_retries())
            .expect("valid config")
            .model_layer(Record {
                name: "first",
                log: log.clone(),
            })
            .model_layer(Record {
                name: "second",
                log: log.clone(),
            });

        let response = middleware
            .wrap_model(inner)
            .oneshot(model_call(None))
            .await
            .expect("model response");

        assert_eq!(response.message.content, "the key is [redacted]");
        assert_eq!(
            *log.lock().expect("test log"),
            [
                "first>",
                "second>",
                "inner",
                "inner",
                "<second: the key is [redacted]",
                "<first: the key is [redacted]",
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn model_timeout_turns_a_slow_model_into_a_timed_out_failure() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let slow = tower::service_fn(move |_: ModelCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, BoxError>(text_response("too late"))
            }
        });
        let middleware = Middleware::new()
            .builtins(BuiltinConfig {
                model_timeout: Some(Duration::from_secs(1)),
                model_retry: RetryConfig::off(),
                ..BuiltinConfig::default()
            })
            .expect("valid config");

        let error = middleware
            .wrap_model(slow)
            .oneshot(model_call(None))
            .await
            .expect_err("the call outlives its timeout");

        assert_eq!(failure_from_error(error).kind, FailureKind::TimedOut);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_model_attempt_is_retried() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let slow = tower::service_fn(move |_: ModelCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, BoxError>(text_response("too late"))
            }
        });
        let middleware = Middleware::new()
            .builtins(BuiltinConfig {
                model_timeout: Some(Duration::from_secs(1)),
                model_retry: RetryConfig {
                    attempts: 3,
                    ..RetryConfig::default()
                },
                ..BuiltinConfig::default()
            })
            .expect("valid config");

        let error = middleware
            .wrap_model(slow)
            .oneshot(model_call(None))
            .await
            .expect_err("every attempt times out");

        assert_eq!(failure_from_error(error).kind, FailureKind::TimedOut);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    /// An inner tool service that counts the calls running at once and remembers the most.
    fn tracked_tool(
        running: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    ) -> impl Fn(ToolCallRequest) -> futures::future::BoxFuture<'static, Result<ToolResult, BoxError>>
           + Clone {
        move |request: ToolCallRequest| {
            let (running, most) = (running.clone(), most.clone());
            Box::pin(async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(ok_result(&request.call.id, "done"))
            })
        }
    }

    async fn most_at_once(tool_concurrency: Option<usize>) -> usize {
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let inner = tower::service_fn(tracked_tool(running, most.clone()));
        let tools = Middleware::new()
            .builtins(BuiltinConfig {
                tool_concurrency,
                ..BuiltinConfig::default()
            })
            .expect("valid config")
            .wrap_tools(inner);

        let (first, second) = tokio::join!(
            tools.clone().oneshot(tool_request("c1", "read")),
            tools.clone().oneshot(tool_request("c2", "read")),
        );
        assert!(first.expect("first call").outcome.is_ok());
        assert!(second.expect("second call").outcome.is_ok());
        most.load(Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn tool_concurrency_limit_holds_the_second_call_until_the_first_finishes() {
        assert_eq!(most_at_once(Some(1)).await, 1);
        // Without the limit both calls run at once: the limit is what held the second one.
        assert_eq!(most_at_once(None).await, 2);
    }

    #[tokio::test]
    async fn a_limited_service_is_not_ready_while_its_permit_is_taken() {
        let inner =
            tower::service_fn(|_: ModelCall| async { Ok::<_, BoxError>(text_response("hi")) });
        let model = Middleware::new()
            .builtins(BuiltinConfig {
                model_concurrency: Some(1),
                ..BuiltinConfig::default()
            })
            .expect("valid config")
            .wrap_model(inner);

        let mut first = model.clone();
        let in_flight = first
            .ready()
            .await
            .expect("first is ready")
            .call(model_call(None));
        let mut second = model.clone();
        assert!(
            futures::FutureExt::now_or_never(second.ready()).is_none(),
            "a clone shares the semaphore"
        );
        in_flight.await.expect("first answers");
        second.ready().await.expect("ready once the first finished");
    }

    #[test]
    fn invalid_builtins_are_refused() {
        let zero_limit = BuiltinConfig {
            tool_concurrency: Some(0),
            ..BuiltinConfig::default()
        };
        assert!(matches!(
            Middleware::new().builtins(zero_limit),
            Err(MiddlewareError::ZeroConcurrency { service: "tool" })
        ));
        let inverted_backoff = BuiltinConfig {
            model_retry: RetryConfig {
                attempts: 2,
                base_delay: Duration::from_secs(10),
                max_delay: Duration::from_secs(1),
            },
            ..BuiltinConfig::default()
        };
        assert!(matches!(
            Middleware::new().builtins(inverted_backoff),
            Err(MiddlewareError::InvalidBackoff {
                service: "model",
                ..
            })
        ));
    }

    #[tokio::test]
    async fn hooks_and_transformers_are_kept_in_order() {
        let middleware = Middleware::new()
            .prompt_transformer(Arc::new(|_, prompt| format!("{prompt} one")))
            .prompt_transformer(Arc::new(|_, prompt| format!("{prompt} two")));
        assert_eq!(
            middleware.prompt().apply(&agent_spec(), "zero".into()),
            "zero one two"
        );
        assert!(middleware.hooks().is_empty());
    }
}
