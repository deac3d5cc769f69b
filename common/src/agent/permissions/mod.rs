//! Permission decisions: whether one tool call runs, waits for a person's approval, or is denied.
//!
//! [`decide`] is a pure function of a [`CompiledPolicy`] and the call; the tool-call layer only
//! adapts its [`Decision`]. It settles a call in this order, the first step that speaks wins:
//! 1. a matching `deny` rule denies;
//! 2. a matching `ask` rule asks;
//! 3. the tool's own check ([`tool_check`]) allows or denies;
//! 4. a matching `allow` rule allows;
//! 5. the mode decides from the tool's declared [`ToolEffects`]:
//!    - `bypass`: allow;
//!    - `accept_edits`: workspace edits are allowed, other destructive tools ask, the rest allowed;
//!    - `default`: destructive tools ask, the rest are allowed;
//!    - `dont_ask`: destructive tools are denied, the rest are allowed;
//!    - `read_only`: read-only tools are allowed, the rest denied.
//!
//! In `dont_ask` mode nothing asks: an ask from any step becomes a denial whose reason says what
//! would have asked. Every decision carries a reason naming the rule, check or mode that made it.
//!
//! Layout: `rules` parses and matches rule strings (and documents their glob syntax, see
//! [`Rule`]); `check` holds the tools' own checks; `combine` merges an agent's policy with its
//! folder's ([`merge`]) and tightens it with a task's overrides ([`tighten`], [`restrict`]);
//! `approvers` says who may answer a call that asks ([`ApproverPolicy`]).

use std::time::Duration;

use serde_json::Value;

use crate::protocol::{PermissionMode, PermissionPolicy, ToolEffects, Verdict};

mod approvers;
mod check;
mod combine;
mod rules;

pub use approvers::{
    Approver, ApproverEntry, ApproverError, ApproverPolicy, ApproverRule, ROLE_PREFIX,
};
pub use check::{tool_check, RUNTIME_TOOLS, WORKSPACE_FILE_TOOLS};
pub use combine::{merge, restrict, tighten};
pub use rules::{
    always_rule, always_rule_for_call, check_always_rule, compile_all, matches_any,
    primary_argument, PermissionError, Rule, PRIMARY_ARGUMENT_KEYS,
};

/// What happens to one call, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The call runs.
    Allow { reason: String },
    /// The call waits for a person's approval.
    Ask { reason: String },
    /// The call is refused; the reason is shown to the model.
    Deny { reason: String },
}

impl Decision {
    /// The rule, check or mode that decided (`"deny rule write_file(secrets/**)"`).
    pub fn reason(&self) -> &str {
        match self {
            Decision::Allow { reason } | Decision::Ask { reason } | Decision::Deny { reason } => {
                reason
            }
        }
    }

    /// The verdict recorded for this decision before any person answers.
    pub fn verdict(&self) -> Verdict {
        match self {
            Decision::Allow { .. } => Verdict::Allowed,
            Decision::Ask { .. } => Verdict::Asked,
            Decision::Deny { .. } => Verdict::Denied,
        }
    }
}

/// A [`PermissionPolicy`] whose rules are compiled, ready for [`decide`].
#[derive(Debug, Clone, Default)]
pub struct CompiledPolicy {
    mode: PermissionMode,
    allow: Vec<Rule>,
    ask: Vec<Rule>,
    deny: Vec<Rule>,
    approval_timeout: Option<Duration>,
}

impl CompiledPolicy {
    /// Compiles every rule of `policy`; the first rule that does not parse is the error. An
    /// absent mode is `default`.
    pub fn compile(policy: &PermissionPolicy) -> Result<Self, PermissionError> {
        Ok(Self {
            mode: policy.mode.unwrap_or_default(),
            allow: compile_all(&policy.allow)?,
            ask: compile_all(&policy.ask)?,
            deny: compile_all(&policy.deny)?,
            approval_timeout: policy.approval_timeout_ms.map(Duration::from_millis),
        })
    }

    /// The mode that decides calls no rule or check spoke about.
    pub fn mode(&self) -> PermissionMode {
        self.mode
    }

    /// How long an approval request waits; `None` waits until the task's deadline.
    pub fn approval_timeout(&self) -> Option<Duration> {
        self.approval_timeout
    }
}

/// Decides one call of `tool` with `arguments`, the tool declaring `effects` (see the module
/// documentation for the order of the steps).
pub fn decide(
    policy: &CompiledPolicy,
    tool: &str,
    effects: ToolEffects,
    arguments: &Value,
) -> Decision {
    if let Some(rule) = matches_any(&policy.deny, tool, arguments) {
        return Decision::Deny {
            reason: format!("deny rule {rule}"),
        };
    }
    let decision = if let Some(rule) = matches_any(&policy.ask, tool, arguments) {
        Decision::Ask {
            reason: format!("ask rule {rule}"),
        }
    } else if let Some(checked) = tool_check(tool, arguments) {
        checked
    } else if let Some(rule) = matches_any(&policy.allow, tool, arguments) {
        Decision::Allow {
            reason: format!("allow rule {rule}"),
        }
    } else {
        mode_default(policy.mode, tool, effects)
    };
    match decision {
        Decision::Ask { reason } if policy.mode == PermissionMode::DontAsk => Decision::Deny {
            reason: format!("mode dont_ask: would ask ({reason})"),
        },
        other => other,
    }
}

/// The first of a session's approved rules (added by a person's "always approve") that matches
/// the call; rules that do not parse are skipped.
pub fn approved_for_session(
    session_rules: &[String],
    tool: &str,
    arguments: &Value,
) -> Option<String> {
    session_rules
        .iter()
        .find(|text| Rule::parse(text).is_ok_and(|rule| rule.matches(tool, arguments)))
        .cloned()
}

/// What the mode decides about a call no rule or check spoke about.
fn mode_default(mode: PermissionMode, tool: &str, effects: ToolEffects) -> Decision {
    let label = mode.as_str();
    let allow = |why: &str| Decision::Allow {
        reason: format!("mode {label}: {tool} {why}"),
    };
    match mode {
        PermissionMode::Bypass => Decision::Allow {
            reason: "mode bypass".into(),
        },
        PermissionMode::ReadOnly if effects.read_only => allow("is read-only"),
        PermissionMode::ReadOnly => Decision::Deny {
            reason: format!("mode read_only: {tool} is not read-only"),
        },
        PermissionMode::AcceptEdits if effects.edits_workspace => allow("edits the workspace"),
        PermissionMode::DontAsk if effects.destructive => Decision::Deny {
            reason: format!("mode dont_ask: {tool} is destructive"),
        },
        PermissionMode::AcceptEdits | PermissionMode::Default if effects.destructive => {
            Decision::Ask {
                reason: format!("mode {label}: {tool} is destructive"),
            }
        }
        PermissionMode::AcceptEdits | PermissionMode::Default | PermissionMode::DontAsk => {
            allow("is not destructive")
        }
    }
}

#[cfg(test)]
mod tests;
