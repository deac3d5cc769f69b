//! The seams of the runtime: everything the ReAct loop reaches outside itself goes through one of
//! these, so the loop depends on no transport and no store.
//!
//! - **Tools** are a `tower::Service<ToolCallRequest, Response = ToolResult>`: the NATS dispatcher
//!   is one implementation (`dispatch::Dispatcher`), `InMemoryTools` another. A failed call is a
//!   `ToolResult` with a failed outcome; a service error (a layer's timeout, an overloaded limit)
//!   is turned into one by [`failure_from_error`].
//! - **The model** is a `tower::Service<ModelCall, Response = ModelResponse>`: `ProviderService`
//!   adapts any `ModelClient` (the OpenAI-compatible and scripted providers).
//! - **The tool list** the model sees comes from a [`ToolDirectory`].
//! - **Events** go to an [`EventSink`], **checkpoints** to a [`CheckpointSink`], and **answers to
//!   approval requests** come from an [`ApprovalGate`]; their NATS and Redis implementations live in
//!   `crate::wiring`.
//!
//! Middleware wraps the two services (`agent::middleware`); the loop clones a service per call and
//! drives it with `oneshot`, so a layer's state (a concurrency limit's semaphore) is shared by every
//! clone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::protocol::ApprovalAnswer;

use crate::agent::model::{ModelChunk, ModelClient, ModelError, ModelRequest, ModelResponse};
use crate::agent::tools::ToolCatalog;
use crate::protocol::message::{Message, ToolCall, Usage};
use crate::protocol::{AgentSpec, EventKind, Failure, FailureKind, TaskOrigin};

/// The error type services and layers may return; the loop turns it into a [`Failure`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tool call as the tool service receives it.
#[derive(Debug, Clone)]
pub struct ToolCallRequest {
    /// The task and session the call belongs to (shared by every call of the turn).
    pub origin: Arc<TaskOrigin>,
    /// The turn's step (model call) that asked for it; with the call id it keys the result.
    pub step: u32,
    pub call: ToolCall,
    /// A plain tool, or a subagent to run.
    pub target: CallTarget,
    /// Longest the call may run.
    pub timeout: Duration,
    /// An earlier run of the turn may have dispatched this call: look for its recorded result
    /// before running it again.
    pub may_have_run: bool,
}

/// What a call runs.
#[derive(Debug, Clone)]
pub enum CallTarget {
    /// The tool named by the call.
    Tool,
    /// A child agent loop: the agent, its task, and how deep it runs.
    Subagent {
        agent: Arc<AgentSpec>,
        task: String,
        depth: u32,
        /// The skills the child may load.
        skills: Vec<crate::protocol::SkillDocument>,
    },
}

/// One model call as the model service receives it.
#[derive(Clone)]
pub struct ModelCall {
    pub request: ModelRequest,
    /// Receives text and reasoning deltas as they stream (the turn forwards them as events);
    /// `None` asks for a whole answer.
    pub deltas: Option<Arc<dyn DeltaSink>>,
    /// The task the call serves (its tenant shares the model fairly, its deadline bounds waits);
    /// `None` outside a task.
    pub origin: Option<Arc<TaskOrigin>>,
}

impl std::fmt::Debug for ModelCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCall")
            .field("request", &self.request)
            .field("streaming", &self.deltas.is_some())
            .finish()
    }
}

/// Where streamed deltas go: pieces of the answer's text, and pieces of the model's reasoning
/// (thinking models), each in the order they streamed.
pub trait DeltaSink: Send + Sync {
    fn delta(&self, text: String) -> BoxFuture<'_, ()>;

    /// A piece of reasoning; dropped unless the sink takes it. A layer that wraps a sink forwards
    /// it (and applies to it what it applies to text).
    fn reasoning(&self, text: String) -> BoxFuture<'_, ()> {
        let _ = text;
        Box::pin(futures::future::ready(()))
    }

    /// The attempt that streamed the pieces since the call began (or since the last discard)
    /// failed with `failure` and the call is made again: those pieces are not part of the
    /// answer. Dropped unless the sink takes it; a layer that wraps a sink forwards it (and drops
    /// what it holds back of that attempt).
    fn discard(&self, failure: Failure) -> BoxFuture<'_, ()> {
        let _ = failure;
        Box::pin(futures::future::ready(()))
    }
}

/// Where a turn's events go.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: EventKind) -> BoxFuture<'_, ()>;
}

/// Where a turn records its progress, before each step's calls are dispatched. An `Err` means the
/// progress could not be recorded (the lease was lost, the store is away): the turn stops.
pub trait CheckpointSink: Send + Sync {
    fn save<'a>(&'a self, state: &'a TurnCheckpoint) -> BoxFuture<'a, Result<(), Failure>>;
}

/// Where a turn finds the tools its model may call.
pub trait ToolDirectory: Send + Sync {
    fn current(&self) -> BoxFuture<'_, Result<Arc<ToolCatalog>, Failure>>;
}

/// Where a turn finds the answers given to its approval requests.
pub trait ApprovalGate: Send + Sync {
    fn answers<'a>(&'a self, origin: &'a TaskOrigin) -> BoxFuture<'a, Result<Answers, Failure>>;
}

/// What was asked of a running turn besides cancelling it: a pause, steer messages, an interrupt
/// by a later task of its session.
pub trait TurnControls: Send + Sync {
    /// The turn's controls if they may have changed since the last look (`None`: nothing new,
    /// found without I/O), with the steer messages after the first `steered`.
    fn changed(&self, steered: u32) -> BoxFuture<'_, Result<Option<ControlUpdate>, Failure>>;
}

/// The controls of a running turn, as the runtime acts on them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ControlUpdate {
    /// Stop at this step boundary, dispatching nothing new, until resumed.
    pub paused: bool,
    /// End the turn before its next model call, keeping its work (a later task of the session
    /// asked: `multitask: interrupt`).
    pub interrupted_by: Option<String>,
    /// Messages to add as the user's before the next model call, in order.
    pub steer: Vec<String>,
}

/// What is known about a turn's approval requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answers {
    /// Answers by call id.
    pub by_call: HashMap<String, ApprovalAnswer>,
    /// Calls already announced as waiting (their `approval_requested` event went out).
    pub requested: Vec<String>,
    /// When unanswered requests of this turn are denied (milliseconds since the Unix epoch).
    pub expires_at_ms: Option<u64>,
    /// Rules a person approved for the rest of the session (`--always`).
    pub session_rules: Vec<String>,
}

/// The progress of a turn that has not ended, recorded before each step's calls are dispatched so
/// the turn can be resumed (by another lead) without asking the model again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnCheckpoint {
    /// What the turn has added so far: the user's input, model messages, observations.
    pub new_messages: Vec<Message>,
    /// Model calls made so far.
    pub iterations: u32,
    pub usage: Usage,
    /// Skills loaded during the turn so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded_skills: Vec<String>,
    /// The history compacted during the turn so far (a resumed turn does not summarise again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<crate::agent::runtime::Compaction>,
    /// The session's plan as the turn left it so far, when the turn changed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::protocol::Plan>,
    /// Steer messages the turn has taken so far (they are among `new_messages`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub steered: u32,
    /// When each step so far had all its calls answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_ends: Vec<StepEnd>,
}

impl TurnCheckpoint {
    /// Appends the checkpoint's JSON to `out`: byte for byte its `Serialize` output, with the
    /// messages' texts written a word at a time ([`Message::write_json`]).
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        use crate::json_out::push_member;
        // Every field named: a new one does not compile until it is written here.
        let TurnCheckpoint {
            new_messages,
            iterations,
            usage,
            loaded_skills,
            compaction,
            plan,
            steered,
            step_ends,
        } = self;
        out.extend_from_slice(b"{\"new_messages\":[");
        for (n, message) in new_messages.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            message.write_json(out)?;
        }
        out.push(b']');
        push_member(out, "iterations", iterations)?;
        push_member(out, "usage", usage)?;
        if !loaded_skills.is_empty() {
            push_member(out, "loaded_skills", loaded_skills)?;
        }
        if let Some(compaction) = compaction {
            push_member(out, "compaction", compaction)?;
        }
        if let Some(plan) = plan {
            push_member(out, "plan", plan)?;
        }
        if !is_zero(steered) {
            push_member(out, "steered", steered)?;
        }
        if !step_ends.is_empty() {
            push_member(out, "step_ends", step_ends)?;
        }
        out.push(b'}');
        Ok(())
    }
}

/// When a step of a turn ended: every call of its model response answered, before the next
/// model call. A fork at the step gets the workspace's files as they were then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEnd {
    /// The step (the turn's model response it follows, from 1).
    pub step: u32,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The failure a service error stands for: a [`Failure`] it carries, a layer's timeout
/// (`timed_out`), an overloaded limit (`unavailable`), anything else (`internal`).
pub fn failure_from_error(error: BoxError) -> Failure {
    let error = match error.downcast::<Failure>() {
        Ok(failure) => return *failure,
        Err(error) => error,
    };
    if error.is::<tower::timeout::error::Elapsed>() {
        return Failure::new(FailureKind::TimedOut, "the call timed out");
    }
    Failure::new(FailureKind::Internal, error.to_string())
}

/// Adapts a [`ModelClient`] into the model service.
#[derive(Clone)]
pub struct ProviderService<M> {
    client: M,
}

impl<M> ProviderService<M> {
    pub fn new(client: M) -> Self {
        Self { client }
    }
}

impl<M> tower::Service<ModelCall> for ProviderService<M>
where
    M: ModelClient + Clone + 'static,
{
    type Response = ModelResponse;
    type Error = Failure;
    type Future = BoxFuture<'static, Result<ModelResponse, Failure>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ModelCall) -> Self::Future {
        let client = self.client.clone();
        Box::pin(async move {
            let Some(deltas) = call.deltas else {
                return client
                    .complete(call.request)
                    .await
                    .map_err(|e| e.to_failure());
            };
            let mut stream = client
                .stream(call.request)
                .await
                .map_err(|e| e.to_failure())?;
            while let Some(chunk) = stream.next().await {
                match chunk.map_err(|e| e.to_failure())? {
                    ModelChunk::Delta(text) => deltas.delta(text).await,
                    ModelChunk::Reasoning(text) => deltas.reasoning(text).await,
                    ModelChunk::Done(response) => return Ok(response),
                }
            }
            Err(ModelError::BadResponse("stream ended without a response".into()).to_failure())
        })
    }
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::TurnCheckpoint;

    /// `write_json` of `checkpoint`, checked against its `Serialize` output and read back.
    fn written_as_serialized(checkpoint: &TurnCheckpoint) {
        let mut written = Vec::new();
        checkpoint.write_json(&mut written).expect("written");
        assert_eq!(
            String::from_utf8(written.clone()).expect("UTF-8"),
            serde_json::to_string(checkpoint).expect("serialized")
        );
        let read: TurnCheckpoint = serde_json::from_slice(&written).expect("read back");
        assert_eq!(&read, checkpoint);
    }

    #[test]
    fn a_checkpoint_is_written_as_it_serializes() {
        // Every field of the checkpoint and of its messages set, texts that need escaping.
        let full: TurnCheckpoint = serde_json::from_value(json!({
            "new_messages": [
                {"role": "user", "content": "quote \" backslash \\ tab\t nul\u{0} é 🦀",
                 "images": [{"source": "url", "url": "https://example.com/a.png"}]},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"id": "c1", "name": "grep", "arguments": {"q": "a\"b\n"}}],
                 "reasoning": "thinking\nstill", "reasoning_signature": "sig=="},
                {"role": "tool", "content": "x".repeat(180), "tool_call_id": "c1"},
                {"role": "system", "content": "\u{1f}\u{7f}\u{2028}"},
            ],
            "iterations": 3,
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "cache_read_tokens": 4},
            "loaded_skills": ["pdf", "review"],
            "compaction": {"summary": {"text": "earlier", "messages": 4}, "compacted": 4,
                           "steps": {"text": "steps", "messages": 2}},
            "plan": {"explanation": "why", "plan": [
                {"id": "1", "step": "look", "status": "completed", "agent": "scout",
                 "after": ["0"], "worker_id": "w1", "duration_ms": 12}]},
            "steered": 1,
            "step_ends": [{"step": 1, "at_ms": 1700000000000u64}],
        }))
        .expect("a checkpoint");
        assert!(full.compaction.is_some() && full.plan.is_some() && full.steered == 1);
        written_as_serialized(&full);
        // Every optional field absent.
        written_as_serialized(&TurnCheckpoint::default());
        written_as_serialized(&TurnCheckpoint {
            new_messages: full.new_messages[2..3].to_vec(),
            ..TurnCheckpoint::default()
        });
    }
}
