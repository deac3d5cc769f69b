//! In-memory implementations of every seam: a runtime that needs no NATS and no Redis, for
//! embedding an agent in a process of one's own and for tests.
//!
//! - [`InMemoryTools`]: the tool service over async functions registered by name; results are
//!   recorded by session and call key (task, step, call id) like the cluster's, so a resumed turn gets a
//!   finished call's result back instead of running it again; subagent calls run a child turn on
//!   a runtime given with [`InMemoryTools::run_subagents_on`].
//! - [`FixedDirectory`]: a tool directory that always offers the same catalog.
//! - [`MemoryEvents`], [`MemoryCheckpoints`], [`MemoryApprovals`]: event, checkpoint and approval
//!   seams that keep what they get in memory.
//!
//! Invariant: nothing here blocks on a lock across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::agent::runtime::{Runtime, TurnInput};
use crate::agent::seams::{
    Answers, ApprovalGate, CallTarget, CheckpointSink, EventSink, ToolCallRequest, ToolDirectory,
    TurnCheckpoint,
};
use crate::agent::tools::ToolCatalog;
use crate::protocol::{
    call_key, child_session_id, CallOutcome, EventKind, Failure, FailureKind, TaskOrigin,
    ToolResult, ToolSpec, PROTOCOL_VERSION,
};

/// An async tool function: arguments in, output or failure out.
pub type ToolFn = Arc<dyn Fn(Value) -> BoxFuture<'static, Result<String, Failure>> + Send + Sync>;

/// The tool service over registered functions.
#[derive(Clone, Default)]
pub struct InMemoryTools {
    tools: Arc<HashMap<String, (ToolSpec, ToolFn)>>,
    recorded: Arc<Mutex<HashMap<String, ToolResult>>>,
    runs: Arc<Mutex<Vec<String>>>,
    subagents: Arc<OnceLock<Weak<Runtime>>>,
}

impl InMemoryTools {
    /// Tools by spec, each with its function.
    pub fn new(tools: impl IntoIterator<Item = (ToolSpec, ToolFn)>) -> Self {
        let tools = tools
            .into_iter()
            .map(|(spec, f)| (spec.name.clone(), (spec, f)))
            .collect();
        Self {
            tools: Arc::new(tools),
            ..Self::default()
        }
    }

    /// The catalog of these tools (served by one pool, `memory`, which also runs subagents).
    pub fn catalog(&self) -> ToolCatalog {
        let specs = self.tools.values().map(|(spec, _)| spec.clone()).collect();
        ToolCatalog::from_specs("memory", specs, true)
    }

    /// Runs subagent calls as child turns on `runtime` (usually the runtime these tools serve,
    /// held weakly so the two do not keep each other alive).
    pub fn run_subagents_on(&self, runtime: &Arc<Runtime>) {
        let _ = self.subagents.set(Arc::downgrade(runtime));
    }

    /// The call keys of the calls actually run (not answered from the record), in order.
    pub fn runs(&self) -> Vec<String> {
        self.runs.lock().map(|r| r.clone()).unwrap_or_default()
    }

    async fn run(self, request: ToolCallRequest) -> ToolResult {
        // Keyed like the cluster's record: per session, then by task, step and call id (a
        // subagent's calls share the task id, not the session).
        let key = format!(
            "{}/{}",
            request.origin.session,
            call_key(&request.origin.task_id, request.step, &request.call.id)
        );
        if let Some(recorded) = self.recorded.lock().ok().and_then(|r| r.get(&key).cloned()) {
            return recorded;
        }
        if let Ok(mut runs) = self.runs.lock() {
            runs.push(key.clone());
        }
        let started = std::time::Instant::now();
        let outcome = match &request.target {
            CallTarget::Tool => match self.tools.get(&request.call.name) {
                Some((_, f)) => f(request.call.arguments.clone()).await,
                None => Err(Failure::new(
                    FailureKind::UnknownTool,
                    format!("no tool {:?}", request.call.name),
                )),
            },
            CallTarget::Subagent {
                agent,
                task,
                depth,
                skills,
            } => {
                let skills = crate::agent::skills::SkillCatalog::from_skills(skills.clone());
                self.run_subagent(
                    &request.origin,
                    &request.call.id,
                    agent,
                    task,
                    *depth,
                    &skills,
                )
                .await
            }
        };
        let result = ToolResult {
            v: PROTOCOL_VERSION,
            call_id: request.call.id.clone(),
            outcome: match outcome {
                Ok(output) => CallOutcome::ok(output),
                Err(failure) => CallOutcome::Failed { failure },
            },
            worker_id: "memory".into(),
            duration_ms: started.elapsed().as_millis() as u64,
            attempts: 0,
        };
        if let Ok(mut recorded) = self.recorded.lock() {
            recorded.entry(key).or_insert_with(|| result.clone());
        }
        result
    }

    async fn run_subagent(
        &self,
        origin: &TaskOrigin,
        call_id: &str,
        agent: &crate::protocol::AgentSpec,
        task: &str,
        depth: u32,
        skills: &crate::agent::skills::SkillCatalog,
    ) -> Result<String, Failure> {
        let Some(runtime) = self.subagents.get().and_then(Weak::upgrade) else {
            return Err(Failure::new(
                FailureKind::Unavailable,
                "no runtime runs subagents here",
            ));
        };
        let child = Arc::new(TaskOrigin {
            session: child_session_id(&origin.session, call_id),
            ..origin.clone()
        });
        let cancel = CancellationToken::new();
        let output = Box::pin(runtime.run_turn(TurnInput {
            origin: child,
            agent,
            history: &[],
            summary: None,
            loaded_skills: &[],
            plan: None,
            skills: Some(skills),
            input: task.to_owned(),
            input_images: Vec::new(),
            depth,
            events: Arc::new(MemoryEvents::default()),
            cancel: &cancel,
            resume: None,
            first_run: true,
            checkpoints: None,
            approvals: None,
            controls: None,
            recorded: None,
        }))
        .await
        .map_err(|stop| Failure::new(FailureKind::Internal, format!("{stop:?}")))?;
        match (output.answer, output.failure) {
            (_, Some(failure)) => Err(failure),
            (Some(answer), None) => Ok(answer),
            (None, None) => Err(Failure::new(
                FailureKind::ModelFailed,
                "subagent gave no answer",
            )),
        }
    }
}

impl tower::Service<ToolCallRequest> for InMemoryTools {
    type Response = ToolResult;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<ToolResult, std::convert::Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: ToolCallRequest) -> Self::Future {
        let tools = self.clone();
        Box::pin(async move { Ok(tools.run(request).await) })
    }
}

/// A directory that always offers one catalog.
pub struct FixedDirectory(pub Arc<ToolCatalog>);

impl ToolDirectory for FixedDirectory {
    fn current(&self) -> BoxFuture<'_, Result<Arc<ToolCatalog>, Failure>> {
        let catalog = self.0.clone();
        Box::pin(async move { Ok(catalog) })
    }
}

/// Keeps every event emitted.
#[derive(Default)]
pub struct MemoryEvents {
    events: Mutex<Vec<EventKind>>,
}

impl MemoryEvents {
    pub fn events(&self) -> Vec<EventKind> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

impl EventSink for MemoryEvents {
    fn emit(&self, event: EventKind) -> BoxFuture<'_, ()> {
        if let Ok(mut events) = self.events.lock() {
            events.push(event);
        }
        Box::pin(async {})
    }
}

/// Keeps the latest checkpoint.
#[derive(Default)]
pub struct MemoryCheckpoints {
    latest: Mutex<Option<TurnCheckpoint>>,
}

impl MemoryCheckpoints {
    pub fn latest(&self) -> Option<TurnCheckpoint> {
        self.latest.lock().ok().and_then(|l| l.clone())
    }
}

impl CheckpointSink for MemoryCheckpoints {
    fn save<'a>(&'a self, state: &'a TurnCheckpoint) -> BoxFuture<'a, Result<(), Failure>> {
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(state.clone());
        }
        Box::pin(async { Ok(()) })
    }
}

/// Answers given in memory.
#[derive(Default)]
pub struct MemoryApprovals {
    answers: Mutex<Answers>,
}

impl MemoryApprovals {
    /// Changes the stored answers.
    pub fn update(&self, change: impl FnOnce(&mut Answers)) {
        if let Ok(mut answers) = self.answers.lock() {
            change(&mut answers);
        }
    }
}

impl ApprovalGate for MemoryApprovals {
    fn answers<'a>(&'a self, _: &'a TaskOrigin) -> BoxFuture<'a, Result<Answers, Failure>> {
        let answers = self.answers.lock().map(|a| a.clone()).unwrap_or_default();
        Box::pin(async move { Ok(answers) })
    }
}
