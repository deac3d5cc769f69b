//! The acting step of a turn: the calls of one model response, decided, run and observed.
//!
//! For each call, in this order: an unknown tool or a repeated call id is an observation; the
//! permission policy decides (deny > ask > the tool's own check > allow > the mode's default); a
//! call that asks is looked up at the approval gate (a person's answer, a rule approved for the
//! session, or expiry). If any call still waits, no call of the step runs: their
//! `approval_requested` events go out and the turn stops with [`TurnStop::AwaitingApproval`].
//! Otherwise denied calls become observations ("denied by …"), and the rest run through the
//! acting hooks and the tool service — consecutive concurrency-safe calls together, an unsafe call
//! alone — and come back in the model's order. Every verdict other than a plain allow is an
//! `approval_resolved` event; every verdict, a plain allow included, is carried by the call's
//! `tool_started` event, a span attribute and a log line. A result's images past the image caps
//! (`RuntimeSettings::images`) make its observation a `too_large` failure; the rest go on the
//! call's tool message.

use serde_json::{json, Value};
use tower::{Service, ServiceExt};
use tracing::Instrument;

use super::{record_failure, turn_context, Awaiting, Runtime, TurnInput, TurnStop};
use crate::agent::permissions::{approved_for_session, decide, CompiledPolicy, Decision};
use crate::agent::seams::{failure_from_error, Answers, CallTarget, ToolCallRequest};
use crate::agent::tools::ToolCatalog;
use crate::protocol::message::ToolCall;
use crate::protocol::{
    now_ms, AgentSpec, CallOutcome, EventKind, Failure, FailureKind, ImagePart, PendingCall,
    ToolSpec, Verdict,
};

/// Name of the tool through which an agent hands a subtask to one of its subagents.
pub const SPAWN_TOOL: &str = "spawn_agent";
/// Name of the tool through which an agent loads a skill's body.
pub const LOAD_SKILL_TOOL: &str = "load_skill";

/// The worker id a call answered from a replay's record reports.
pub const REPLAYED: &str = "record";

/// The workspace tool that puts a skill's resource files in the session's workspace.
const WRITE_TOOL: &str = "write_file";

/// Longest preview of an observation carried in a `tool_finished` event.
const PREVIEW_CHARS: usize = 200;

/// What the model observes of one call.
pub(super) struct Observation {
    pub text: String,
    /// Images the call returned, within the caps.
    pub images: Vec<ImagePart>,
    /// The skill a successful `load_skill` call loaded.
    pub loaded_skill: Option<String>,
}

impl Observation {
    fn of(outcome: &CallOutcome) -> Self {
        Self {
            text: outcome.observation(),
            images: outcome.images().to_vec(),
            loaded_skill: None,
        }
    }
}

/// How one call of a step was settled before it runs.
struct Settled {
    verdict: Verdict,
    /// The rule (or mode) behind the verdict.
    rule: String,
    by: String,
    reason: String,
}

/// One turn's acting context.
pub(super) struct Acting<'r, 't> {
    pub runtime: &'r Runtime,
    pub turn: &'r TurnInput<'t>,
    pub catalog: &'r ToolCatalog,
    pub tools: &'r [ToolSpec],
    pub policy: &'r CompiledPolicy,
    /// Set once a call of the turn asks for approval.
    pub asked: &'r std::sync::atomic::AtomicBool,
    /// The turn's plan.
    pub board: &'r super::planning::PlanBoard,
}

impl Acting<'_, '_> {
    /// Runs the calls of one model response; observations come back in the calls' order.
    pub async fn execute_calls(
        &self,
        step: u32,
        calls: &[ToolCall],
    ) -> Result<Vec<Observation>, TurnStop> {
        if let Some(duplicate) = duplicate_call_id(calls) {
            // Results are keyed by call id within a step: two calls with one id cannot both be
            // answered.
            let failure = Failure::new(
                FailureKind::InvalidArguments,
                format!(
                    "the model used call id {duplicate:?} twice in one response; no call was run"
                ),
            );
            let outcome = CallOutcome::Failed { failure };
            return Ok(calls.iter().map(|_| Observation::of(&outcome)).collect());
        }
        let settled = self.settle_permissions(calls).await?;
        let mut observations = Vec::with_capacity(calls.len());
        for batch in concurrency_batches(calls, self.tools) {
            let offset = observations.len();
            let running = batch
                .iter()
                .zip(&settled[offset..offset + batch.len()])
                .map(|(call, settled)| self.execute_call(step, call, settled));
            let done = tokio::select! {
                _ = self.turn.cancel.cancelled() => None,
                done = futures::future::join_all(running) => Some(done),
            };
            let Some(done) = done else {
                return Err(TurnStop::cancelled());
            };
            if let Some(awaiting) = self.board.take_suspension() {
                // `run_plan` left steps waiting for a person; the steps that ran are recorded.
                return Err(TurnStop::AwaitingApproval(awaiting));
            }
            if done.iter().any(|(outcome, _)| stopped_by_cancel(outcome)) {
                // A worker stopped a call on the task's cancel request, which may reach this
                // turn later: the turn stops now, as it would on hearing it.
                self.turn.cancel.cancel();
                return Err(TurnStop::cancelled());
            }
            observations.extend(done.into_iter().map(|(_, observation)| observation));
        }
        Ok(observations)
    }

    /// Decides every call of the step; stops the turn if any call waits for a person.
    async fn settle_permissions(&self, calls: &[ToolCall]) -> Result<Vec<Settled>, TurnStop> {
        let decisions: Vec<Decision> = calls
            .iter()
            .map(|call| {
                let effects = self
                    .tools
                    .iter()
                    .find(|t| t.name == call.name)
                    .map(|t| t.effects)
                    .unwrap_or_default();
                decide(self.policy, &call.name, effects, &call.arguments)
            })
            .collect();
        let asks = decisions.iter().any(|d| matches!(d, Decision::Ask { .. }));
        if asks {
            self.asked.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let answers = match (asks, self.turn.approvals) {
            (true, Some(gate)) => gate
                .answers(&self.turn.origin)
                .await
                .map_err(TurnStop::Interrupted)?,
            _ => Answers::default(),
        };
        let now = now_ms();
        let mut settled = Vec::with_capacity(calls.len());
        let mut pending = Vec::new();
        for (call, decision) in calls.iter().zip(decisions) {
            let outcome = match decision {
                Decision::Allow { reason } => settled_as(Verdict::Allowed, reason),
                Decision::Deny { reason } => settled_as(Verdict::Denied, reason),
                Decision::Ask { reason } if self.turn.approvals.is_none() => settled_as(
                    Verdict::Denied,
                    format!("{reason}; nobody can approve calls of this run"),
                ),
                Decision::Ask { reason } => {
                    if let Some(rule) =
                        approved_for_session(&answers.session_rules, &call.name, &call.arguments)
                    {
                        Settled {
                            verdict: Verdict::Approved,
                            rule,
                            by: "session rule".into(),
                            reason: String::new(),
                        }
                    } else if let Some(answer) = answers.by_call.get(&call.id) {
                        Settled {
                            verdict: if answer.approve {
                                Verdict::Approved
                            } else {
                                Verdict::Refused
                            },
                            rule: reason,
                            by: answer.by.clone(),
                            reason: answer.reason.clone(),
                        }
                    } else if answers.expires_at_ms.is_some_and(|at| now >= at) {
                        settled_as(Verdict::Expired, reason)
                    } else {
                        pending.push(PendingCall {
                            call_id: call.id.clone(),
                            tool: call.name.clone(),
                            arguments: call.arguments.clone(),
                            rule: reason.clone(),
                        });
                        settled_as(Verdict::Asked, reason)
                    }
                }
            };
            settled.push(outcome);
        }
        if !pending.is_empty() {
            // A first request's expiry comes from the agent's approval timeout; later looks keep
            // the stored one.
            let expires_at_ms = answers.expires_at_ms.or_else(|| {
                self.policy
                    .approval_timeout()
                    .map(|t| now.saturating_add(t.as_millis() as u64))
            });
            for call in &pending {
                tracing::info!(call_id = %call.call_id, tool = %call.tool, rule = %call.rule, "call waits for approval");
                if answers.requested.contains(&call.call_id) {
                    continue;
                }
                self.turn
                    .events
                    .emit(EventKind::ApprovalRequested {
                        call_id: call.call_id.clone(),
                        tool: call.tool.clone(),
                        arguments: call.arguments.clone(),
                        arguments_ref: None,
                        rule: call.rule.clone(),
                        expires_at_ms,
                    })
                    .await;
            }
            return Err(TurnStop::AwaitingApproval(Awaiting {
                calls: pending,
                expires_at_ms,
            }));
        }
        for (call, settled) in calls.iter().zip(&settled) {
            self.audit(call, settled).await;
        }
        Ok(settled)
    }

    /// The audit trail of one verdict: an `info` log line and an `approval_resolved` event, unless
    /// it is a plain allow, whose verdict and rule the `tool_started` event and the call's span
    /// carry: that is logged at `debug` (at `info` it would be a line for every call).
    async fn audit(&self, call: &ToolCall, settled: &Settled) {
        let bypass = self.policy.mode() == crate::protocol::PermissionMode::Bypass;
        if settled.verdict == Verdict::Allowed && !bypass {
            tracing::debug!(call_id = %call.id, tool = %call.name, verdict = "allowed", rule = %settled.rule, "permission");
            return;
        }
        tracing::info!(
            call_id = %call.id,
            tool = %call.name,
            verdict = settled.verdict.as_str(),
            rule = %settled.rule,
            by = %settled.by,
            "permission"
        );
        self.turn
            .events
            .emit(EventKind::ApprovalResolved {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                verdict: settled.verdict,
                rule: settled.rule.clone(),
                by: settled.by.clone(),
                reason: settled.reason.clone(),
            })
            .await;
    }

    async fn execute_call(
        &self,
        step: u32,
        call: &ToolCall,
        settled: &Settled,
    ) -> (CallOutcome, Observation) {
        let events = &self.turn.events;
        events
            .emit(EventKind::ToolStarted {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                arguments: call.arguments.clone(),
                arguments_ref: None,
                permission: Some(settled.verdict),
                rule: settled.rule.clone(),
            })
            .await;
        let span = tracing::info_span!(
            "execute_tool",
            "otel.name" = format!("execute_tool {}", call.name),
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = %call.name,
            "gen_ai.tool.call.id" = %call.id,
            "gen_ai.tool.call.arguments" = tracing::field::Empty,
            "gen_ai.tool.call.result" = tracing::field::Empty,
            "skein.permission" = settled.verdict.as_str(),
            "skein.permission.rule" = %settled.rule,
            "skein.worker_id" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        if crate::telemetry::record_content() {
            span.record("gen_ai.tool.call.arguments", call.arguments.to_string());
        }
        let (outcome, ran, loaded_skill) = if settled.verdict.runs() {
            self.act(step, call).instrument(span.clone()).await
        } else {
            (denied_outcome(settled), Ran::default(), None)
        };
        if !ran.worker_id.is_empty() {
            span.record("skein.worker_id", ran.worker_id.as_str());
        }
        // Images past the caps fail the call: the model is told, rather than shown less.
        let outcome = match self
            .runtime
            .settings
            .images
            .check("the tool's result", outcome.images())
        {
            Ok(()) => outcome,
            Err(failure) => CallOutcome::Failed { failure },
        };
        match &outcome {
            CallOutcome::Failed { failure } => record_failure(&span, failure),
            CallOutcome::Ok { output, .. } if crate::telemetry::record_content() => {
                span.record("gen_ai.tool.call.result", output.as_str());
            }
            CallOutcome::Ok { .. } => {}
        }
        let observation = Observation {
            text: outcome.observation(),
            images: outcome.images().to_vec(),
            loaded_skill: loaded_skill.filter(|_| outcome.is_ok()),
        };
        events
            .emit(EventKind::ToolFinished {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                ok: outcome.is_ok(),
                worker_id: ran.worker_id,
                preview: observation.text.chars().take(PREVIEW_CHARS).collect(),
                duration_ms: ran.duration_ms,
                attempts: ran.attempts,
            })
            .await;
        (outcome, observation)
    }

    /// The acting step of one allowed call: `before_acting` may change the call or answer in the
    /// tool's place; `after_acting` may change its outcome.
    async fn act(&self, step: u32, call: &ToolCall) -> (CallOutcome, Ran, Option<String>) {
        let hooks = self.runtime.middleware.hooks();
        // Boxed: kept for the whole call, and most turns have no hooks.
        let ctx = (!hooks.is_empty()).then(|| Box::new(turn_context(self.turn, step)));
        // A copy only for hooks, which may change the call.
        let call = match &ctx {
            // Boxed, as the exit below: inline, hooks' futures would grow every call's.
            Some(ctx) => match Box::pin(hooks.enter_acting(ctx, call.clone())).await {
                Ok(call) => std::borrow::Cow::Owned(call),
                // A hook answered in the tool's place (its outer hooks' `after_acting` ran).
                Err(outcome) => return (outcome, Ran::default(), None),
            },
            None => std::borrow::Cow::Borrowed(call),
        };
        let (outcome, ran, skill) = self.route(step, &call).await;
        let outcome = match &ctx {
            Some(ctx) => Box::pin(hooks.exit_acting(ctx, &call, outcome)).await,
            None => outcome,
        };
        (outcome, ran, skill)
    }

    /// Sends a call where it runs: the runtime's own tools here, the rest to the tool service.
    async fn route(&self, step: u32, call: &ToolCall) -> (CallOutcome, Ran, Option<String>) {
        let failed = |kind, message: String| CallOutcome::Failed {
            failure: Failure::new(kind, message),
        };
        if !self.tools.iter().any(|t| t.name == call.name) {
            let known: Vec<_> = self.tools.iter().map(|t| t.name.as_str()).collect();
            let message = format!(
                "unknown tool {:?}; available: {}",
                call.name,
                known.join(", ")
            );
            return (
                failed(FailureKind::UnknownTool, message),
                Ran::default(),
                None,
            );
        }
        if let Some(failure) = undecodable_arguments(call) {
            return (CallOutcome::Failed { failure }, Ran::default(), None);
        }
        // A replay answers a call the recorded turn made from the record (its side effects are
        // not repeated); the runtime's own bookkeeping tools run, to keep the turn's state.
        let bookkeeping = matches!(
            call.name.as_str(),
            LOAD_SKILL_TOOL | super::UPDATE_PLAN_TOOL | super::READ_PLAN_TOOL
        );
        if let Some(output) = self
            .turn
            .recorded
            .filter(|_| !bookkeeping)
            .and_then(|recorded| recorded.answer(call))
        {
            return (CallOutcome::ok(output), Ran::at(REPLAYED), None);
        }
        if super::planning::is_plan_tool(&call.name) {
            // Boxed: `run_plan`'s future is large, and inline it would grow every call's.
            return (
                Box::pin(self.plan_tool(step, call)).await,
                Ran::default(),
                None,
            );
        }
        if call.name == LOAD_SKILL_TOOL {
            // Boxed: rare, and inline it would grow every call's future.
            return match Box::pin(self.load_skill(step, call)).await {
                Ok((name, body)) => (CallOutcome::ok(body), Ran::default(), Some(name)),
                Err(failure) => (CallOutcome::Failed { failure }, Ran::default(), None),
            };
        }
        let settings = &self.runtime.settings;
        let (target, timeout) = if call.name == SPAWN_TOOL {
            match self.spawn_target(&call.arguments) {
                Ok(target) => (target, settings.subagent_timeout),
                Err(failure) => return (CallOutcome::Failed { failure }, Ran::default(), None),
            }
        } else {
            (CallTarget::Tool, settings.tool_timeout)
        };
        // The request is made once the service is ready, and moved into its call: the call's
        // future does not keep a second copy of it.
        let mut tools = self.runtime.tools.clone();
        let response = match tools.ready().await {
            Ok(ready) => {
                ready
                    .call(ToolCallRequest {
                        origin: self.turn.origin.clone(),
                        step,
                        call: call.clone(),
                        target,
                        timeout,
                        may_have_run: !self.turn.first_run,
                    })
                    .await
            }
            Err(error) => Err(error),
        };
        match response {
            Ok(result) => (
                result.outcome,
                Ran {
                    worker_id: result.worker_id,
                    duration_ms: result.duration_ms,
                    attempts: result.attempts,
                },
                None,
            ),
            Err(error) => (
                CallOutcome::Failed {
                    failure: failure_from_error(error),
                },
                Ran::default(),
                None,
            ),
        }
    }

    /// The skills of this turn: those its task carried, else the runtime's.
    fn skills(&self) -> &crate::agent::skills::SkillCatalog {
        self.turn.skills.unwrap_or(&self.runtime.skills)
    }

    pub(super) fn spawn_target(&self, arguments: &Value) -> Result<CallTarget, Failure> {
        let (agent, task) = parse_spawn_arguments(arguments)?;
        let subagents = &self.turn.agent.subagents;
        let Some(child) = subagents.iter().find(|s| s.name == agent) else {
            let known: Vec<_> = subagents.iter().map(|s| s.name.as_str()).collect();
            return Err(Failure::new(
                FailureKind::UnknownAgent,
                format!(
                    "unknown subagent {agent:?}; available: {}",
                    known.join(", ")
                ),
            ));
        };
        if self.catalog.pool_for_subagent(&child.name).is_none() {
            return Err(Failure::new(
                FailureKind::Unavailable,
                format!("no live worker runs subagent {:?}", child.name),
            ));
        }
        Ok(CallTarget::Subagent {
            skills: self.skills().documents(child.skills.as_deref()),
            agent: std::sync::Arc::new(child.clone()),
            task,
            depth: self.turn.depth + 1,
        })
    }

    /// A skill's body and resource list, if the agent may load it; its resource files are
    /// copied into the session's workspace (through the tool service's `write_file`, recorded by
    /// call key like any call, so a resumed turn does not write them twice).
    async fn load_skill(&self, step: u32, call: &ToolCall) -> Result<(String, String), Failure> {
        let invalid = |message: String| Failure::new(FailureKind::InvalidArguments, message);
        let name = call
            .arguments
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("{LOAD_SKILL_TOOL}: expected {{\"name\": string}}")))?;
        let skills = self.skills();
        let allowed = skills.allowed(self.turn.agent.skills.as_deref());
        if !allowed.iter().any(|s| s == name) {
            return Err(invalid(format!(
                "unknown skill {name:?}; available: {}",
                allowed.join(", ")
            )));
        }
        let (Some(skill), Some(text)) = (skills.get(name), skills.load_text(name)) else {
            return Err(invalid(format!("unknown skill {name:?}")));
        };
        if !skill.resources.is_empty() {
            if self.catalog.pool_for_tool(WRITE_TOOL).is_none() {
                return Err(Failure::new(
                    FailureKind::Unavailable,
                    format!("skill {name:?} has resource files, but no live worker provides {WRITE_TOOL} to put them in the workspace"),
                ));
            }
            let writes = skill.resources.iter().enumerate().map(|(i, resource)| {
                let request = ToolCallRequest {
                    origin: self.turn.origin.clone(),
                    step,
                    call: ToolCall {
                        id: format!("{}-skill-{i}", call.id),
                        name: WRITE_TOOL.into(),
                        arguments: json!({
                            "path": skill.workspace_path(&resource.path),
                            "content": resource.content,
                        }),
                    },
                    target: CallTarget::Tool,
                    timeout: self.runtime.settings.tool_timeout,
                    may_have_run: !self.turn.first_run,
                };
                self.runtime.tools.clone().oneshot(request)
            });
            for written in futures::future::join_all(writes).await {
                match written.map_err(failure_from_error).map(|r| r.outcome) {
                    Ok(CallOutcome::Ok { .. }) => {}
                    Ok(CallOutcome::Failed { failure }) | Err(failure) => {
                        return Err(Failure::new(
                            failure.kind,
                            format!(
                                "skill {name:?}: a resource file was not written: {}",
                                failure.message
                            ),
                        ));
                    }
                }
            }
        }
        Ok((name.to_owned(), text))
    }
}

fn settled_as(verdict: Verdict, rule: String) -> Settled {
    Settled {
        verdict,
        rule,
        by: String::new(),
        reason: String::new(),
    }
}

/// The outcome the model observes for a call that does not run.
fn denied_outcome(settled: &Settled) -> CallOutcome {
    let message = match settled.verdict {
        Verdict::Refused if settled.reason.is_empty() => {
            format!("denied by {}", or_person(&settled.by))
        }
        Verdict::Refused => format!("denied by {}: {}", or_person(&settled.by), settled.reason),
        Verdict::Expired => format!(
            "denied: nobody answered the approval request in time ({})",
            settled.rule
        ),
        _ => format!("denied by {}", settled.rule),
    };
    CallOutcome::Failed {
        failure: Failure::new(FailureKind::Denied, message),
    }
}

fn or_person(by: &str) -> &str {
    if by.is_empty() {
        "a person"
    } else {
        by
    }
}

/// Whether a call ended because its task was cancelled.
fn stopped_by_cancel(outcome: &CallOutcome) -> bool {
    matches!(outcome, CallOutcome::Failed { failure } if failure.kind == FailureKind::Cancelled)
}

/// Groups calls so that consecutive concurrency-safe calls run together and an unsafe call runs
/// alone, keeping the model's order.
fn concurrency_batches<'c>(calls: &'c [ToolCall], tools: &[ToolSpec]) -> Vec<&'c [ToolCall]> {
    let safe = |call: &ToolCall| {
        tools
            .iter()
            .find(|t| t.name == call.name)
            .is_none_or(|t| t.concurrency_safe)
    };
    let mut batches = Vec::new();
    let mut start = 0;
    for (i, call) in calls.iter().enumerate() {
        if !safe(call) {
            if start < i {
                batches.push(&calls[start..i]);
            }
            batches.push(&calls[i..=i]);
            start = i + 1;
        }
    }
    if start < calls.len() {
        batches.push(&calls[start..]);
    }
    batches
}

fn duplicate_call_id(calls: &[ToolCall]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    calls
        .iter()
        .map(|c| c.id.as_str())
        .find(|id| !seen.insert(*id))
}

pub(super) fn spawn_tool_spec(subagents: &[AgentSpec]) -> ToolSpec {
    let names: Vec<_> = subagents.iter().map(|s| s.name.clone()).collect();
    ToolSpec {
        name: SPAWN_TOOL.into(),
        description: "Hand a self-contained subtask to a subagent and get its answer.".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "agent": { "type": "string", "enum": names, "description": "Which subagent runs the subtask." },
                "task": { "type": "string", "description": "The subtask, with everything the subagent needs to know." }
            },
            "required": ["agent", "task"],
            "additionalProperties": false
        }),
        concurrency_safe: true,
        effects: Default::default(),
    }
}

pub(super) fn load_skill_spec(skills: &[String]) -> ToolSpec {
    ToolSpec {
        name: LOAD_SKILL_TOOL.into(),
        description: "Load a skill from the catalog in your instructions: returns its full \
                      instructions and the files that come with it. A loaded skill stays \
                      loaded for the rest of the session."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "name": { "type": "string", "enum": skills, "description": "The skill to load." }
            },
            "required": ["name"],
            "additionalProperties": false
        }),
        concurrency_safe: true,
        effects: crate::protocol::ToolEffects {
            read_only: true,
            ..Default::default()
        },
    }
}

/// A call whose arguments the model wrote as text that is not a JSON object (the provider keeps
/// such text as a JSON string): nothing runs it, and the model is told what it wrote. The
/// provider sends such a call back to the server with `{}` as its arguments.
fn undecodable_arguments(call: &ToolCall) -> Option<Failure> {
    let Value::String(raw) = &call.arguments else {
        return None;
    };
    Some(Failure::new(
        FailureKind::InvalidArguments,
        format!(
            "{}: the arguments are not a valid JSON object (got {:?}); the call was not run; \
             send the arguments as one JSON object",
            call.name,
            crate::text::cut(raw, PREVIEW_CHARS)
        ),
    ))
}

fn parse_spawn_arguments(arguments: &Value) -> Result<(String, String), Failure> {
    let invalid = |message: &str| {
        Failure::new(
            FailureKind::InvalidArguments,
            format!("{SPAWN_TOOL}: {message}; expected {{\"agent\": string, \"task\": string}}"),
        )
    };
    let object = arguments
        .as_object()
        .ok_or_else(|| invalid("arguments are not an object"))?;
    if let Some(extra) = object.keys().find(|k| *k != "agent" && *k != "task") {
        return Err(invalid(&format!("unknown field {extra:?}")));
    }
    let field = |name: &str| {
        object
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| invalid(&format!("missing string field {name:?}")))
    };
    let task = field("task")?;
    if task.trim().is_empty() {
        return Err(invalid("task is empty"));
    }
    Ok((field("agent")?, task))
}

/// Where and how a call ran, for its `tool_finished` event: the worker (or `replayed`; empty
/// when it ran in the turn itself), how long the worker took, and how often it was delivered.
#[derive(Debug, Default)]
struct Ran {
    worker_id: String,
    duration_ms: u64,
    attempts: u32,
}

impl Ran {
    fn at(place: &str) -> Self {
        Ran {
            worker_id: place.to_owned(),
            ..Ran::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: json!({}),
        }
    }

    fn spec(name: &str, safe: bool) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({}),
            concurrency_safe: safe,
            effects: Default::default(),
        }
    }

    #[test]
    fn unsafe_calls_run_alone_and_order_is_kept() {
        let tools = [spec("read", true), spec("write", false)];
        let calls = [
            call("1", "read"),
            call("2", "read"),
            call("3", "write"),
            call("4", "read"),
            call("5", "write"),
        ];
        let ids: Vec<Vec<&str>> = concurrency_batches(&calls, &tools)
            .iter()
            .map(|b| b.iter().map(|c| c.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["1", "2"], vec!["3"], vec!["4"], vec!["5"]]);
    }

    #[test]
    fn duplicate_call_ids_are_found() {
        assert_eq!(duplicate_call_id(&[call("1", "a"), call("2", "a")]), None);
        assert_eq!(
            duplicate_call_id(&[call("1", "a"), call("2", "b"), call("1", "c")]),
            Some("1")
        );
    }

    #[test]
    fn arguments_that_are_not_json_become_an_invalid_arguments_observation() {
        let mut broken = call("c1", "read_file");
        broken.arguments = Value::String("{\"path\": \"a.txt\"".to_owned());
        let failure = undecodable_arguments(&broken).expect("rejected");
        assert_eq!(failure.kind, FailureKind::InvalidArguments);
        assert!(
            failure.message.contains("not a valid JSON object"),
            "{}",
            failure.message
        );
        assert!(
            failure.message.contains("a.txt"),
            "shows what the model wrote"
        );
        let outcome = CallOutcome::Failed { failure };
        assert!(outcome
            .observation()
            .starts_with("error (invalid_arguments)"));
        let mut fine = call("c2", "read_file");
        fine.arguments = json!({"path": "a.txt"});
        assert!(undecodable_arguments(&fine).is_none());
    }

    #[test]
    fn spawn_arguments_are_validated() {
        assert_eq!(
            parse_spawn_arguments(&json!({"agent": "r", "task": "t"})).expect("valid"),
            ("r".to_string(), "t".to_string())
        );
        for bad in [
            json!("r"),
            json!({"agent": "r"}),
            json!({"agent": 1, "task": "t"}),
            json!({"agent": "r", "task": "t", "x": 1}),
            json!({"agent": "r", "task": " "}),
        ] {
            let err = parse_spawn_arguments(&bad).expect_err("invalid");
            assert_eq!(err.kind, FailureKind::InvalidArguments, "{bad}");
        }
    }

    #[test]
    fn denials_say_why() {
        let by_rule = settled_as(Verdict::Denied, "deny rule shell".into());
        assert!(denied_outcome(&by_rule)
            .observation()
            .contains("denied by deny rule shell"));
        let by_person = Settled {
            verdict: Verdict::Refused,
            rule: "ask rule shell".into(),
            by: "alice".into(),
            reason: "not on prod".into(),
        };
        assert!(denied_outcome(&by_person)
            .observation()
            .contains("denied by alice: not on prod"));
    }
}
