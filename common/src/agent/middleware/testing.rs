//! Values and test doubles shared by the middleware's unit tests: requests, responses, and a
//! delta sink that keeps what it gets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::agent::model::{ModelRequest, ModelResponse};
use crate::agent::seams::{CallTarget, DeltaSink, ModelCall, ToolCallRequest};
use crate::protocol::message::{Message, ToolCall, Usage};
use crate::protocol::{
    AgentSpec, CallOutcome, Failure, FailureKind, TaskOrigin, ToolResult, PROTOCOL_VERSION,
};

pub(super) fn origin() -> TaskOrigin {
    TaskOrigin {
        task_id: "t1".into(),
        tenant: "acme".into(),
        user: "ada".into(),
        session: "s1".into(),
        workspace: "s1".into(),
        deadline_ms: None,
        budget: None,
        run_budget: None,
    }
}

pub(super) fn agent_spec() -> AgentSpec {
    AgentSpec {
        name: "coder".into(),
        description: String::new(),
        system_prompt: "You write code.".into(),
        model: String::new(),
        tools: vec!["*".into()],
        subagents: Vec::new(),
        max_iterations: 8,
        permissions: Default::default(),
        skills: None,
        context_tokens: None,
        fallback_models: Vec::new(),
        planning: false,
        max_parallel_steps: None,
        max_concurrency: None,
        budget: None,
        output_schema: None,
    }
}

pub(super) fn tool_request(call_id: &str, tool: &str) -> ToolCallRequest {
    ToolCallRequest {
        origin: origin().into(),
        step: 1,
        call: ToolCall {
            id: call_id.into(),
            name: tool.into(),
            arguments: serde_json::json!({}),
        },
        target: CallTarget::Tool,
        timeout: Duration::from_secs(30),
        may_have_run: false,
    }
}

pub(super) fn ok_result(call_id: &str, output: &str) -> ToolResult {
    result(call_id, CallOutcome::ok(output))
}

pub(super) fn failed_result(call_id: &str, kind: FailureKind, message: &str) -> ToolResult {
    result(
        call_id,
        CallOutcome::Failed {
            failure: Failure::new(kind, message),
        },
    )
}

fn result(call_id: &str, outcome: CallOutcome) -> ToolResult {
    ToolResult {
        v: PROTOCOL_VERSION,
        call_id: call_id.into(),
        outcome,
        worker_id: "w1".into(),
        duration_ms: 1,
        attempts: 0,
    }
}

pub(super) fn model_call(deltas: Option<Arc<dyn DeltaSink>>) -> ModelCall {
    ModelCall {
        request: ModelRequest {
            model: "test-model".into(),
            agent: "coder".into(),
            messages: std::sync::Arc::new(vec![Message::user("hello")]),
            tools: Default::default(),
            max_output_tokens: None,
            output_schema: None,
        },
        deltas,
        origin: None,
    }
}

pub(super) fn text_response(text: &str) -> ModelResponse {
    ModelResponse {
        message: Message::assistant(text),
        finish_reason: Some("stop".into()),
        usage: Usage::default(),
    }
}

/// A transient model failure: the server could not be reached.
pub(super) fn unavailable() -> Failure {
    Failure::new(FailureKind::Unavailable, "model server unreachable")
}

/// A transient model failure: the server answered 429.
pub(super) fn rate_limited() -> Failure {
    Failure {
        kind: FailureKind::ModelFailed,
        message: "model server answered 429".into(),
        retryable: true,
    }
}

/// A 429 whose server asked to wait `wait` (its `Retry-After`), as the provider reports it.
pub(super) fn rate_limited_for(wait: Duration) -> Failure {
    crate::agent::model::ModelError::Status {
        status: 429,
        body: "slow down".into(),
        retry_after: Some(wait),
    }
    .to_failure()
}

/// Keeps every delta it receives.
/// Every delta received, in order: `(true, piece)` for reasoning, `(false, piece)` for text.
#[derive(Default)]
pub(super) struct CollectedDeltas(Mutex<Vec<(bool, String)>>);

impl CollectedDeltas {
    /// The text pieces, in order.
    pub(super) fn pieces(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|(reasoning, _)| !reasoning)
            .map(|(_, piece)| piece)
            .collect()
    }

    pub(super) fn text(&self) -> String {
        self.pieces().concat()
    }

    /// Every piece, reasoning or text, in the order received.
    pub(super) fn all(&self) -> Vec<(bool, String)> {
        self.0.lock().expect("deltas").clone()
    }
}

impl DeltaSink for CollectedDeltas {
    fn delta(&self, text: String) -> BoxFuture<'_, ()> {
        self.0.lock().expect("deltas").push((false, text));
        Box::pin(futures::future::ready(()))
    }

    fn reasoning(&self, text: String) -> BoxFuture<'_, ()> {
        self.0.lock().expect("deltas").push((true, text));
        Box::pin(futures::future::ready(()))
    }
}
