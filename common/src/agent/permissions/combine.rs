//! Combining policies: folder-wide rules with an agent's own ([`merge`]), and an agent's policy
//! with a task's overrides ([`tighten`], [`restrict`]).
//!
//! Invariants: a task can only make a policy stricter — a stricter mode (by [`PermissionMode`]'s
//! order, loosest first), more `ask` and `deny` rules, a shorter approval timeout; anything looser
//! is refused as invalid input, never silently dropped.

use crate::protocol::{Failure, FailureKind, PermissionMode, PermissionPolicy};

use super::rules::Rule;

/// An agent's policy on top of its folder's `permissions.toml`: the agent's mode and approval
/// timeout win when it sets them; rule lists are concatenated, the folder's first.
pub fn merge(folder: &PermissionPolicy, agent: &PermissionPolicy) -> PermissionPolicy {
    PermissionPolicy {
        mode: agent.mode.or(folder.mode),
        allow: concat(&folder.allow, &agent.allow),
        ask: concat(&folder.ask, &agent.ask),
        deny: concat(&folder.deny, &agent.deny),
        approval_timeout_ms: agent.approval_timeout_ms.or(folder.approval_timeout_ms),
    }
}

/// Applies a task's overrides to an agent's policy, refusing anything that would loosen it: a
/// looser mode, `allow` rules, or a rule that does not parse (each an `InvalidInput` failure).
pub fn tighten(
    base: &PermissionPolicy,
    overrides: &PermissionPolicy,
) -> Result<PermissionPolicy, Failure> {
    let invalid = |message: String| Failure::new(FailureKind::InvalidInput, message);
    if !overrides.allow.is_empty() {
        return Err(invalid(format!(
            "a task cannot add allow rules (got {:?}); it may only add ask or deny rules",
            overrides.allow
        )));
    }
    for text in overrides.ask.iter().chain(&overrides.deny) {
        Rule::parse(text).map_err(|e| invalid(e.to_string()))?;
    }
    let current = base.mode.unwrap_or_default();
    if let Some(requested) = overrides.mode.filter(|m| *m < current) {
        return Err(invalid(format!(
            "a task cannot loosen the permission mode from {} to {}",
            current.as_str(),
            requested.as_str()
        )));
    }
    Ok(restrict(base, overrides))
}

/// The stricter of two policies without refusing anything: the stricter mode, `limits`' `ask` and
/// `deny` rules appended to `base`'s, the shorter approval timeout; `limits`' `allow` rules are
/// ignored. This is how a task's (already tightened) overrides reach the subagents it may spawn,
/// whose own modes may be stricter or looser than the parent's.
pub fn restrict(base: &PermissionPolicy, limits: &PermissionPolicy) -> PermissionPolicy {
    let mode = match (base.mode, limits.mode) {
        (Some(own), Some(limit)) => Some(own.max(limit)),
        (None, Some(limit)) => Some(PermissionMode::default().max(limit)),
        (own, None) => own,
    };
    let approval_timeout_ms = match (base.approval_timeout_ms, limits.approval_timeout_ms) {
        (Some(own), Some(limit)) => Some(own.min(limit)),
        (own, limit) => own.or(limit),
    };
    PermissionPolicy {
        mode,
        allow: base.allow.clone(),
        ask: concat(&base.ask, &limits.ask),
        deny: concat(&base.deny, &limits.deny),
        approval_timeout_ms,
    }
}

fn concat(first: &[String], second: &[String]) -> Vec<String> {
    first.iter().chain(second).cloned().collect()
}
