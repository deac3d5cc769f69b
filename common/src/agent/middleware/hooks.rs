//! Hooks around the turn, each reasoning step (model call) and each acting step (tool call).
//!
//! A [`TurnHook`]'s `before_*` may change what goes in (the input, the model request, the tool
//! call) or short-circuit the step by answering in its place; its `after_*` may change what comes
//! out. Every method has a no-op default.
//!
//! A [`HookChain`] runs its hooks as an onion, like layers:
//! - `enter_*` runs every hook's `before_*` in the order the hooks were added, each getting what
//!   the one before returned;
//! - `exit_*` runs every hook's `after_*` in reverse order;
//! - when a hook short-circuits, the hooks after it do not run, and the answer goes back out
//!   through the `after_*` of the hooks before it (reverse order) — not through the `after_*` of
//!   the hook that answered, nor of those it kept from running. `enter_*` then returns that
//!   answer as `Err`: it is final, the caller does not run the step nor `exit_*`.
//!
//! Hooks run on the turn's path: they should be quick, and never block.

use std::sync::Arc;

use futures::future::{self, BoxFuture};

use crate::agent::model::{ModelRequest, ModelResponse};
use crate::protocol::message::ToolCall;
use crate::protocol::{CallOutcome, Failure, TaskOrigin};

/// What a hook knows of the turn it runs in.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnContext {
    /// The task and session of the turn (the turn's own, shared).
    pub origin: Arc<TaskOrigin>,
    /// Name of the agent running the turn.
    pub agent: String,
    /// Nesting depth: 0 for the user's agent, 1 for its subagents...
    pub depth: u32,
    /// The step (model call) the hook runs at; 0 around the whole turn.
    pub step: u32,
}

/// How a `before_turn` hook ends a turn without running it.
#[derive(Debug, Clone, PartialEq)]
pub enum Stop {
    /// The turn completes with this answer.
    Answer(String),
    /// The turn fails.
    Fail(Failure),
}

/// How a turn ended, as the `after_turn` hooks see it and may change it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnSummary {
    pub answer: Option<String>,
    pub failure: Option<Failure>,
}

impl From<Stop> for TurnSummary {
    fn from(stop: Stop) -> Self {
        match stop {
            Stop::Answer(answer) => Self {
                answer: Some(answer),
                failure: None,
            },
            Stop::Fail(failure) => Self {
                answer: None,
                failure: Some(failure),
            },
        }
    }
}

/// Code that runs around a turn, its reasoning steps and its acting steps; see the module docs.
pub trait TurnHook: Send + Sync {
    /// May rewrite the user's input, or end the turn before any model call.
    fn before_turn<'a>(
        &'a self,
        _ctx: &'a TurnContext,
        input: String,
    ) -> BoxFuture<'a, Result<String, Stop>> {
        Box::pin(future::ready(Ok(input)))
    }

    /// May change how the turn ended.
    fn after_turn<'a>(
        &'a self,
        _ctx: &'a TurnContext,
        summary: TurnSummary,
    ) -> BoxFuture<'a, TurnSummary> {
        Box::pin(future::ready(summary))
    }

    /// May change the model request, or answer in the model's place (`Err`: the model is not
    /// called).
    fn before_reasoning<'a>(
        &'a self,
        _ctx: &'a TurnContext,
        request: ModelRequest,
    ) -> BoxFuture<'a, Result<ModelRequest, ModelResponse>> {
        Box::pin(future::ready(Ok(request)))
    }

    /// May change the model's response. Not called when the model call failed.
    fn after_reasoning<'a>(
        &'a self,
        _ctx: &'a TurnContext,
        response: ModelResponse,
    ) -> BoxFuture<'a, ModelResponse> {
        Box::pin(future::ready(response))
    }

    /// May change the tool call, or settle it without running it (`Err`: this outcome is what
    /// the model observes).
    fn before_acting<'a>(
        &'a self,
        _ctx: &'a TurnContext,
        call: ToolCall,
    ) -> BoxFuture<'a, Result<ToolCall, CallOutcome>> {
        Box::pin(future::ready(Ok(call)))
    }

    /// May change a call's outcome.
    fn after_acting<'a>(
        &'a self,
        _ctx: &'a TurnContext,
        _call: &'a ToolCall,
        outcome: CallOutcome,
    ) -> BoxFuture<'a, CallOutcome> {
        Box::pin(future::ready(outcome))
    }
}

/// The hooks of a runtime, in the order they were added.
#[derive(Clone, Default)]
pub struct HookChain {
    hooks: Vec<Arc<dyn TurnHook>>,
}

impl HookChain {
    /// Adds a hook inside the ones already there.
    pub fn push(&mut self, hook: Arc<dyn TurnHook>) {
        self.hooks.push(hook);
    }

    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    pub fn len(&self) -> usize {
        self.hooks.len()
    }

    /// Runs `before_turn` of every hook. `Err` is how the turn ended, already through the
    /// `after_turn` of the hooks outside the one that stopped it.
    pub async fn enter_turn(
        &self,
        ctx: &TurnContext,
        mut input: String,
    ) -> Result<String, TurnSummary> {
        for (index, hook) in self.hooks.iter().enumerate() {
            match hook.before_turn(ctx, input).await {
                Ok(next) => input = next,
                Err(stop) => return Err(unwind_turn(&self.hooks[..index], ctx, stop.into()).await),
            }
        }
        Ok(input)
    }

    /// Runs `after_turn` of every hook, the last added first.
    pub async fn exit_turn(&self, ctx: &TurnContext, summary: TurnSummary) -> TurnSummary {
        unwind_turn(&self.hooks, ctx, summary).await
    }

    /// Runs `before_reasoning` of every hook. `Err` is the step's response, already through the
    /// `after_reasoning` of the hooks outside the one that answered.
    pub async fn enter_reasoning(
        &self,
        ctx: &TurnContext,
        mut request: ModelRequest,
    ) -> Result<ModelRequest, ModelResponse> {
        for (index, hook) in self.hooks.iter().enumerate() {
            match hook.before_reasoning(ctx, request).await {
                Ok(next) => request = next,
                Err(response) => {
                    return Err(unwind_reasoning(&self.hooks[..index], ctx, response).await)
                }
            }
        }
        Ok(request)
    }

    /// Runs `after_reasoning` of every hook, the last added first.
    pub async fn exit_reasoning(
        &self,
        ctx: &TurnContext,
        response: ModelResponse,
    ) -> ModelResponse {
        unwind_reasoning(&self.hooks, ctx, response).await
    }

    /// Runs `before_acting` of every hook. `Err` is the call's outcome, already through the
    /// `after_acting` of the hooks outside the one that settled it (they see the call as that
    /// hook got it).
    pub async fn enter_acting(
        &self,
        ctx: &TurnContext,
        mut call: ToolCall,
    ) -> Result<ToolCall, CallOutcome> {
        for (index, hook) in self.hooks.iter().enumerate() {
            match hook.before_acting(ctx, call.clone()).await {
                Ok(next) => call = next,
                Err(outcome) => {
                    return Err(unwind_acting(&self.hooks[..index], ctx, &call, outcome).await)
                }
            }
        }
        Ok(call)
    }

    /// Runs `after_acting` of every hook, the last added first.
    pub async fn exit_acting(
        &self,
        ctx: &TurnContext,
        call: &ToolCall,
        outcome: CallOutcome,
    ) -> CallOutcome {
        unwind_acting(&self.hooks, ctx, call, outcome).await
    }
}

impl std::fmt::Debug for HookChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookChain")
            .field("hooks", &self.hooks.len())
            .finish()
    }
}

async fn unwind_turn(
    hooks: &[Arc<dyn TurnHook>],
    ctx: &TurnContext,
    mut summary: TurnSummary,
) -> TurnSummary {
    for hook in hooks.iter().rev() {
        summary = hook.after_turn(ctx, summary).await;
    }
    summary
}

async fn unwind_reasoning(
    hooks: &[Arc<dyn TurnHook>],
    ctx: &TurnContext,
    mut response: ModelResponse,
) -> ModelResponse {
    for hook in hooks.iter().rev() {
        response = hook.after_reasoning(ctx, response).await;
    }
    response
}

async fn unwind_acting(
    hooks: &[Arc<dyn TurnHook>],
    ctx: &TurnContext,
    call: &ToolCall,
    mut outcome: CallOutcome,
) -> CallOutcome {
    for hook in hooks.iter().rev() {
        outcome = hook.after_acting(ctx, call, outcome).await;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::super::testing::*;
    use super::*;
    use crate::protocol::FailureKind;

    /// A hook that records each of its calls, tags what passes through it, and short-circuits
    /// when told to.
    struct Recording {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
        short_circuit: bool,
    }

    impl Recording {
        fn new(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Arc<Self> {
            Arc::new(Self {
                name,
                log: log.clone(),
                short_circuit: false,
            })
        }

        fn short_circuiting(name: &'static str, log: &Arc<Mutex<Vec<String>>>) -> Arc<Self> {
            Arc::new(Self {
                name,
                log: log.clone(),
                short_circuit: true,
            })
        }

        fn note(&self, what: &str) {
            self.log
                .lock()
                .expect("test log")
                .push(format!("{} {what}", self.name));
        }
    }

    impl TurnHook for Recording {
        fn before_turn<'a>(
            &'a self,
            _: &'a TurnContext,
            input: String,
        ) -> BoxFuture<'a, Result<String, Stop>> {
            self.note("before_turn");
            Box::pin(async move {
                if self.short_circuit {
                    return Err(Stop::Answer(format!("answered by {}", self.name)));
                }
                Ok(format!("{input}+{}", self.name))
            })
        }

        fn after_turn<'a>(
            &'a self,
            _: &'a TurnContext,
            mut summary: TurnSummary,
        ) -> BoxFuture<'a, TurnSummary> {
            self.note("after_turn");
            if let Some(answer) = &mut summary.answer {
                answer.push_str(&format!("+{}", self.name));
            }
            Box::pin(future::ready(summary))
        }

        fn before_reasoning<'a>(
            &'a self,
            _: &'a TurnContext,
            mut request: ModelRequest,
        ) -> BoxFuture<'a, Result<ModelRequest, ModelResponse>> {
            self.note("before_reasoning");
            if self.short_circuit {
                return Box::pin(future::ready(Err(text_response(self.name))));
            }
            request.model.push_str(&format!("+{}", self.name));
            Box::pin(future::ready(Ok(request)))
        }

        fn after_reasoning<'a>(
            &'a self,
            _: &'a TurnContext,
            mut response: ModelResponse,
        ) -> BoxFuture<'a, ModelResponse> {
            self.note("after_reasoning");
            response
                .message
                .content
                .push_str(&format!("+{}", self.name));
            Box::pin(future::ready(response))
        }

        fn before_acting<'a>(
            &'a self,
            _: &'a TurnContext,
            mut call: ToolCall,
        ) -> BoxFuture<'a, Result<ToolCall, CallOutcome>> {
            self.note("before_acting");
            if self.short_circuit {
                return Box::pin(future::ready(Err(CallOutcome::Failed {
                    failure: Failure::new(FailureKind::Denied, format!("by {}", self.name)),
                })));
            }
            call.name.push_str(&format!("+{}", self.name));
            Box::pin(future::ready(Ok(call)))
        }

        fn after_acting<'a>(
            &'a self,
            _: &'a TurnContext,
            call: &'a ToolCall,
            outcome: CallOutcome,
        ) -> BoxFuture<'a, CallOutcome> {
            self.note(&format!("after_acting {}", call.name));
            let outcome = match outcome {
                CallOutcome::Ok { output, .. } => {
                    CallOutcome::ok(format!("{output}+{}", self.name))
                }
                CallOutcome::Failed { mut failure } => {
                    failure.message.push_str(&format!("+{}", self.name));
                    CallOutcome::Failed { failure }
                }
            };
            Box::pin(future::ready(outcome))
        }
    }

    fn chain(hooks: Vec<Arc<Recording>>) -> HookChain {
        let mut chain = HookChain::default();
        for hook in hooks {
            chain.push(hook);
        }
        chain
    }

    fn ctx() -> TurnContext {
        TurnContext {
            origin: origin().into(),
            agent: "coder".into(),
            depth: 0,
            step: 1,
        }
    }

    fn entries(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
        std::mem::take(&mut *log.lock().expect("test log"))
    }

    #[tokio::test]
    async fn befores_run_in_order_and_afters_in_reverse() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let hooks = chain(vec![Recording::new("a", &log), Recording::new("b", &log)]);
        let ctx = ctx();

        let input = hooks.enter_turn(&ctx, "hi".into()).await.expect("no stop");
        let request = hooks
            .enter_reasoning(&ctx, model_call(None).request)
            .await
            .expect("no short-circuit");
        let response = hooks.exit_reasoning(&ctx, text_response("answer")).await;
        let summary = hooks
            .exit_turn(
                &ctx,
                TurnSummary {
                    answer: Some(response.message.content.clone()),
                    failure: None,
                },
            )
            .await;

        assert_eq!(input, "hi+a+b");
        assert_eq!(request.model, "test-model+a+b");
        assert_eq!(response.message.content, "answer+b+a");
        assert_eq!(summary.answer.as_deref(), Some("answer+b+a+b+a"));
        assert_eq!(
            entries(&log),
            [
                "a before_turn",
                "b before_turn",
                "a before_reasoning",
                "b before_reasoning",
                "b after_reasoning",
                "a after_reasoning",
                "b after_turn",
                "a after_turn",
            ]
        );
    }

    #[tokio::test]
    async fn a_short_circuit_goes_back_out_through_the_hooks_before_it_only() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let hooks = chain(vec![
            Recording::new("a", &log),
            Recording::short_circuiting("b", &log),
            Recording::new("c", &log),
        ]);
        let ctx = ctx();

        let response = hooks
            .enter_reasoning(&ctx, model_call(None).request)
            .await
            .expect_err("b answers");

        assert_eq!(response.message.content, "b+a");
        assert_eq!(
            entries(&log),
            [
                "a before_reasoning",
                "b before_reasoning",
                "a after_reasoning"
            ]
        );
    }

    #[tokio::test]
    async fn a_stopped_turn_ends_with_the_stop_through_the_outer_hooks() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let hooks = chain(vec![
            Recording::new("a", &log),
            Recording::short_circuiting("b", &log),
            Recording::new("c", &log),
        ]);

        let summary = hooks
            .enter_turn(&ctx(), "hi".into())
            .await
            .expect_err("b stops the turn");

        assert_eq!(
            summary,
            TurnSummary {
                answer: Some("answered by b+a".into()),
                failure: None,
            }
        );
        assert_eq!(
            entries(&log),
            ["a before_turn", "b before_turn", "a after_turn"]
        );
    }

    #[tokio::test]
    async fn acting_hooks_rewrite_the_call_and_settle_it_in_the_tools_place() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let call = ToolCall {
            id: "c1".into(),
            name: "shell".into(),
            arguments: json!({"command": "ls"}),
        };
        let ctx = ctx();

        let passing = chain(vec![Recording::new("a", &log), Recording::new("b", &log)]);
        let rewritten = passing
            .enter_acting(&ctx, call.clone())
            .await
            .expect("no short-circuit");
        let outcome = passing
            .exit_acting(&ctx, &rewritten, CallOutcome::ok("files"))
            .await;
        assert_eq!(rewritten.name, "shell+a+b");
        assert_eq!(outcome, CallOutcome::ok("files+b+a"));
        entries(&log);

        let settling = chain(vec![
            Recording::new("a", &log),
            Recording::short_circuiting("b", &log),
        ]);
        let outcome = settling
            .enter_acting(&ctx, call)
            .await
            .expect_err("b settles the call");
        let CallOutcome::Failed { failure } = outcome else {
            panic!("expected the denial of b, got {outcome:?}");
        };
        assert_eq!(failure.kind, FailureKind::Denied);
        assert_eq!(failure.message, "by b+a");
        assert_eq!(
            entries(&log),
            [
                "a before_acting",
                "b before_acting",
                "a after_acting shell+a",
            ]
        );
    }

    #[tokio::test]
    async fn a_hook_with_only_defaults_changes_nothing() {
        struct Quiet;
        impl TurnHook for Quiet {}
        let mut hooks = HookChain::default();
        hooks.push(Arc::new(Quiet));
        let ctx = ctx();

        assert_eq!(hooks.enter_turn(&ctx, "hi".into()).await, Ok("hi".into()));
        let response = hooks.exit_reasoning(&ctx, text_response("same")).await;
        assert_eq!(response, text_response("same"));
    }
}
