//! Permission policies and approval decisions as data: what an agent definition declares, what a
//! subagent task carries to a worker, what a person (or any NATS client) answers to an approval
//! request. The decision logic lives in `agent::permissions`; this module only says what travels.
//!
//! Invariants:
//! - a policy is plain data (`mode` plus `allow`, `ask`, `deny` rule strings written like
//!   `tool` or `tool(argument pattern)`), checked when it is loaded, so a turn never meets a rule it
//!   cannot read;
//! - an [`ApprovalDecision`] names its task and, optionally, one call; without a call it answers
//!   every call of the task that waits.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How calls no rule speaks about are treated, from the loosest to the strictest.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PermissionMode {
    /// Everything is allowed (each decision is still logged).
    Bypass,
    /// Like `default`, but workspace edits are allowed without asking.
    AcceptEdits,
    /// Tools marked destructive wait for a person's approval; the rest are allowed.
    #[default]
    Default,
    /// Anything that would ask is denied instead.
    DontAsk,
    /// Only tools marked read-only are allowed.
    ReadOnly,
}

impl PermissionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Bypass => "bypass",
            PermissionMode::AcceptEdits => "accept_edits",
            PermissionMode::Default => "default",
            PermissionMode::DontAsk => "dont_ask",
            PermissionMode::ReadOnly => "read_only",
        }
    }
}

/// The permission rules of an agent (`[permissions]` in its front matter, merged with the agents
/// folder's `permissions.toml`), or a task's tightening of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionPolicy {
    /// Absent means `default` for an agent, and "unchanged" for a task's overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PermissionMode>,
    /// Rules that allow a call without asking (`read_file`, `write_file(notes/**)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Rules that make a call wait for a person's approval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
    /// Rules that refuse a call; they win over every other rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// How long an approval request waits for an answer before it is denied; absent waits until
    /// the task's deadline (or for ever).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_ms: Option<u64>,
}

/// What a tool declares about its effects; the worker registry carries it with the tool's spec.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolEffects {
    /// The tool only reads (files, the network); `read_only` mode allows just these.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// The tool may destroy or change things outside its answer; `default` mode asks first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub destructive: bool,
    /// The tool edits files of the session's workspace; `accept_edits` mode allows it unasked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub edits_workspace: bool,
}

impl ToolEffects {
    /// A tool that only reads.
    pub const READ_ONLY: Self = Self {
        read_only: true,
        destructive: false,
        edits_workspace: false,
    };
    /// A tool that may change or destroy things outside its answer.
    pub const DESTRUCTIVE: Self = Self {
        read_only: false,
        destructive: true,
        edits_workspace: false,
    };
    /// A tool that edits files of the session's workspace (destructive too).
    pub const EDITS_WORKSPACE: Self = Self {
        read_only: false,
        destructive: true,
        edits_workspace: true,
    };
}

/// A person's (or a program's) answer to an approval request, published on
/// `skein.approval.{tenant}.{task_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    pub v: u32,
    pub tenant: String,
    pub task_id: String,
    /// The call answered; absent answers every call of the task that waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The subagent run answered, by its child session (as its request names it in `run`);
    /// absent answers the task's own turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    pub approve: bool,
    /// With `approve`: also approve the later calls of the session like the approved one — the
    /// same tool with the same primary argument, or what `always_rule` allows (a deny rule still
    /// refuses them).
    #[serde(default)]
    pub always: bool,
    /// With `always`: the rule (`tool(glob)`) later calls are approved by; it must match the
    /// approved call. Absent: the approved call's tool and primary argument, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_rule: Option<String>,
    /// Why, shown to the model when the call is denied.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Who decided, as the publisher claims it; a signed decision is recorded under its
    /// verified principal instead (see `principals`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
}

/// One call of a suspended turn that waits for a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PendingCall {
    pub call_id: String,
    pub tool: String,
    pub arguments: serde_json::Value,
    /// The rule (or mode) that asked.
    pub rule: String,
}

/// How a call's permission was settled, for events, spans and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Allowed by a rule, the tool's own check or the mode.
    Allowed,
    /// Refused by a rule, the tool's own check or the mode.
    Denied,
    /// Held for a person's answer.
    Asked,
    /// A person approved it.
    Approved,
    /// A person refused it.
    Refused,
    /// Nobody answered in time.
    Expired,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
            Verdict::Asked => "asked",
            Verdict::Approved => "approved",
            Verdict::Refused => "refused",
            Verdict::Expired => "expired",
        }
    }

    /// Whether the call runs.
    pub fn runs(self) -> bool {
        matches!(self, Verdict::Allowed | Verdict::Approved)
    }
}

/// A suspended turn's request for approval, as stored and as `skein approvals --json` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalRequest {
    pub v: u32,
    pub task_id: String,
    pub tenant: String,
    pub session: String,
    #[serde(default)]
    pub user: String,
    #[serde(default)]
    pub agent: String,
    /// The calls that wait (of the step the turn stopped at).
    pub calls: Vec<PendingCall>,
    /// When a subagent run waits (not the task's own turn): its child session, which `session`
    /// is too. The request is stored under `approval_key(task_id, run)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The calls that led from the task's turn to the waiting run, outermost first (its events'
    /// source is `subagent:` and these joined by `/`); empty for the task's own turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lineage: Vec<String>,
    /// When the turn first asked (milliseconds since the Unix epoch).
    pub requested_at_ms: u64,
    /// When unanswered calls are denied; absent waits for ever (or until the task's deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Answers given so far, by call id.
    #[serde(default)]
    pub answers: std::collections::BTreeMap<String, ApprovalAnswer>,
}

/// Where the approval request of a task's own turn (`run` none) or of one of its subagent runs
/// (`run`: the run's child session) is stored, answered and cleared.
pub fn approval_key(task_id: &str, run: Option<&str>) -> String {
    match run {
        None => task_id.to_owned(),
        Some(run) => format!("{task_id}/{run}"),
    }
}

impl ApprovalRequest {
    /// The key it is stored under ([`approval_key`]).
    pub fn key(&self) -> String {
        approval_key(&self.task_id, self.run.as_deref())
    }

    /// The calls still without an answer.
    pub fn unanswered(&self) -> impl Iterator<Item = &PendingCall> {
        self.calls
            .iter()
            .filter(|c| !self.answers.contains_key(&c.call_id))
    }
}

/// A person's answer to one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ApprovalAnswer {
    pub approve: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub by: String,
    #[serde(default)]
    pub at_ms: u64,
}
