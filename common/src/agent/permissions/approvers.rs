//! Approver rules: who may answer a call that waits for a person. They live only in an agents
//! folder's `permissions.toml` (not in an agent's front matter), next to its permission rules:
//!
//! ```toml
//! self_approval = false          # default true; false: nobody answers a call of a task they submitted
//!
//! [[approvers]]
//! calls = "shell(rm *)"          # a permission rule (see `Rule`): the calls this entry speaks about
//! by = ["olga", "role:operate"]  # principal names, or role:<submit|approve|operate|delegate>
//! tenant = "acme"                # optional: only for this tenant's tasks
//!
//! [[approvers]]
//! calls = "*"
//! by = ["role:approve"]
//! ```
//!
//! [`ApproverPolicy::may_answer`] is a pure function of the policy, the task's tenant, the
//! principal that answers, who submitted the task and the call: with `self_approval = false` the
//! submitter may not answer; otherwise the first rule, in file order, whose tenant (when set) is the
//! task's and whose `calls` matches the call decides: the principal may answer when `by` names it
//! or one of its roles. A call no rule speaks about may be answered by anyone the caller already
//! let answer (the `approve` role is checked before this).
//!
//! Invariants: an [`ApproverPolicy`] only exists once every rule compiled, named at least one
//! approver, named only known roles and valid principal names and tenants; a refusal names the
//! principal, the call's tool and the rule (by its number, counted from 1) that refused it.

use std::fmt;

use serde::de::IntoDeserializer;
use serde::Deserialize;
use serde_json::Value;

use super::rules::{PermissionError, Rule};
use crate::principals::{Principal, Role};
use crate::protocol::validate_token;

/// The prefix of an approver that names a role (`role:operate`) rather than a principal.
pub const ROLE_PREFIX: &str = "role:";

/// One `[[approvers]]` entry of `permissions.toml`, as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproverEntry {
    /// A permission rule (`shell(rm *)`, `*`) over the calls the entry speaks about.
    pub calls: String,
    /// Who may answer those calls: principal names and `role:<role>`.
    #[serde(default)]
    pub by: Vec<String>,
    /// The tenant whose tasks the entry speaks for; absent speaks for every tenant.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Why approver rules could not be compiled; each names its rule by number, counted from 1.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApproverError {
    /// `calls` is not a permission rule.
    #[error("approver rule {number}: calls: {source}")]
    BadCalls {
        number: usize,
        #[source]
        source: PermissionError,
    },
    /// `by` names nobody.
    #[error("approver rule {number}: by is empty; name principals or role:<role>")]
    NobodyApproves { number: usize },
    /// `by` names a role that does not exist.
    #[error("approver rule {number}: unknown role in {entry:?}: {reason}")]
    UnknownRole {
        number: usize,
        entry: String,
        reason: String,
    },
    /// `by` names a principal by a name no principal can have.
    #[error("approver rule {number}: by: {reason}")]
    BadPrincipalName { number: usize, reason: String },
    /// `tenant` is not a valid tenant.
    #[error("approver rule {number}: {reason}")]
    BadTenant { number: usize, reason: String },
}

/// Someone an approver rule lets answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approver {
    /// The principal of this name.
    Principal(String),
    /// Every principal with this role.
    Role(Role),
}

impl Approver {
    /// Parses a principal name or `role:<role>`.
    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match text.strip_prefix(ROLE_PREFIX) {
            Some(role) => {
                let role = role.trim();
                Role::deserialize(role.into_deserializer())
                    .map(Approver::Role)
                    .map_err(|e: serde::de::value::Error| e.to_string())
            }
            None => validate_token("principal name", text)
                .map(|()| Approver::Principal(text.to_owned()))
                .map_err(|f| f.message),
        }
    }

    /// Whether this approver is `principal` or one of its roles.
    pub fn admits(&self, principal: &Principal) -> bool {
        match self {
            Approver::Principal(name) => *name == principal.name,
            Approver::Role(role) => principal.may(*role),
        }
    }
}

impl fmt::Display for Approver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Approver::Principal(name) => f.write_str(name),
            Approver::Role(role) => write!(f, "{ROLE_PREFIX}{}", role.as_str()),
        }
    }
}

/// A compiled `[[approvers]]` entry.
#[derive(Debug, Clone)]
pub struct ApproverRule {
    calls: Rule,
    by: Vec<Approver>,
    tenant: Option<String>,
}

impl ApproverRule {
    /// Compiles entry number `number` (counted from 1).
    fn compile(number: usize, entry: &ApproverEntry) -> Result<Self, ApproverError> {
        let calls = Rule::parse(&entry.calls)
            .map_err(|source| ApproverError::BadCalls { number, source })?;
        if entry.by.is_empty() {
            return Err(ApproverError::NobodyApproves { number });
        }
        let by = entry
            .by
            .iter()
            .map(|text| {
                Approver::parse(text).map_err(|reason| {
                    if text.trim().starts_with(ROLE_PREFIX) {
                        ApproverError::UnknownRole {
                            number,
                            entry: text.clone(),
                            reason,
                        }
                    } else {
                        ApproverError::BadPrincipalName { number, reason }
                    }
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(tenant) = &entry.tenant {
            validate_token("tenant", tenant).map_err(|f| ApproverError::BadTenant {
                number,
                reason: f.message,
            })?;
        }
        Ok(Self {
            calls,
            by,
            tenant: entry.tenant.clone(),
        })
    }

    /// The calls the rule speaks about.
    pub fn calls(&self) -> &Rule {
        &self.calls
    }

    /// Who may answer them.
    pub fn by(&self) -> &[Approver] {
        &self.by
    }

    /// The tenant whose tasks it speaks for; `None` for every tenant.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Whether the rule speaks about this call of a task of `tenant`.
    pub fn speaks_for(&self, tenant: &str, tool: &str, arguments: &Value) -> bool {
        self.tenant.as_deref().is_none_or(|own| own == tenant)
            && self.calls.matches(tool, arguments)
    }

    /// Whether `principal` is one of the rule's approvers.
    pub fn admits(&self, principal: &Principal) -> bool {
        self.by.iter().any(|approver| approver.admits(principal))
    }
}

/// Who may answer which calls (the `[[approvers]]` and `self_approval` of `permissions.toml`).
/// The default has no rules and allows self-approval: whoever may approve answers every call.
#[derive(Debug, Clone)]
pub struct ApproverPolicy {
    self_approval: bool,
    rules: Vec<ApproverRule>,
}

impl Default for ApproverPolicy {
    fn default() -> Self {
        Self {
            self_approval: true,
            rules: Vec::new(),
        }
    }
}

impl ApproverPolicy {
    /// Compiles the entries in file order; `self_approval` absent is `true`. The first bad entry
    /// is the error.
    pub fn compile(
        self_approval: Option<bool>,
        entries: &[ApproverEntry],
    ) -> Result<Self, ApproverError> {
        let rules = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| ApproverRule::compile(index + 1, entry))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            self_approval: self_approval.unwrap_or(true),
            rules,
        })
    }

    /// Whether a person may answer a call of a task they submitted.
    pub fn self_approval(&self) -> bool {
        self.self_approval
    }

    /// The rules, in file order.
    pub fn rules(&self) -> &[ApproverRule] {
        &self.rules
    }

    /// Whether `principal` may answer the call of `tool` with `arguments` that a task of `tenant`,
    /// submitted by `requested_by` (empty when unknown), waits on; the error says why not. See
    /// the module documentation for the order of the checks.
    pub fn may_answer(
        &self,
        tenant: &str,
        principal: &Principal,
        requested_by: &str,
        tool: &str,
        arguments: &Value,
    ) -> Result<(), String> {
        if !self.self_approval && !requested_by.is_empty() && principal.name == requested_by {
            return Err(format!(
                "{} may not answer a call of a task they submitted (self_approval = false)",
                principal.name
            ));
        }
        let Some((index, rule)) = self
            .rules
            .iter()
            .enumerate()
            .find(|(_, rule)| rule.speaks_for(tenant, tool, arguments))
        else {
            return Ok(());
        };
        if rule.admits(principal) {
            return Ok(());
        }
        let by: Vec<String> = rule.by.iter().map(Approver::to_string).collect();
        let scope = rule
            .tenant
            .as_deref()
            .map(|tenant| format!(", tenant {tenant}"))
            .unwrap_or_default();
        Err(format!(
            "{} may not answer {tool} calls: approver rule {} ({}{scope}) allows {}",
            principal.name,
            index + 1,
            rule.calls,
            by.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::principals::EVERY_TENANT;

    fn principal(name: &str, tenant: &str, roles: &[Role]) -> Principal {
        Principal {
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            roles: roles.to_vec(),
        }
    }

    fn entry(calls: &str, by: &[&str], tenant: Option<&str>) -> ApproverEntry {
        ApproverEntry {
            calls: calls.to_owned(),
            by: by.iter().map(|b| b.to_string()).collect(),
            tenant: tenant.map(str::to_owned),
        }
    }

    /// `shell(rm *)` by olga or operators, then everything by approvers.
    fn two_rules(self_approval: Option<bool>) -> ApproverPolicy {
        ApproverPolicy::compile(
            self_approval,
            &[
                entry("shell(rm *)", &["olga", "role:operate"], None),
                entry("*", &["role:approve"], None),
            ],
        )
        .expect("valid rules")
    }

    fn rm() -> Value {
        json!({"command": "rm -rf build"})
    }

    #[test]
    fn the_default_policy_lets_anyone_answer_any_call_even_their_own() {
        let policy = ApproverPolicy::default();
        assert!(policy.self_approval());
        assert!(policy.rules().is_empty());
        let olga = principal("olga", "acme", &[Role::Approve]);
        assert_eq!(
            policy.may_answer("acme", &olga, "olga", "shell", &rm()),
            Ok(())
        );
        let nobody = principal("nobody", "acme", &[]);
        assert_eq!(
            policy.may_answer("acme", &nobody, "", "read_file", &json!({})),
            Ok(())
        );
    }

    #[test]
    fn the_first_matching_rule_decides_by_name_or_role() {
        let policy = two_rules(None);
        let olga = principal("olga", "acme", &[Role::Approve]);
        let ivan = principal("ivan", "acme", &[Role::Operate]);
        let bob = principal("bob", "acme", &[Role::Approve]);
        assert_eq!(
            policy.may_answer("acme", &olga, "sam", "shell", &rm()),
            Ok(())
        );
        assert_eq!(
            policy.may_answer("acme", &ivan, "sam", "shell", &rm()),
            Ok(())
        );
        let refused = policy
            .may_answer("acme", &bob, "sam", "shell", &rm())
            .expect_err("rule 1 decides although rule 2 would allow bob");
        assert_eq!(
            refused,
            "bob may not answer shell calls: approver rule 1 (shell(rm *)) allows olga, role:operate"
        );
        let ls = json!({"command": "ls"});
        assert_eq!(policy.may_answer("acme", &bob, "sam", "shell", &ls), Ok(()));
        let refused = policy
            .may_answer("acme", &ivan, "sam", "shell", &ls)
            .expect_err("rule 2 wants the approve role");
        assert!(
            refused.contains("approver rule 2 (*) allows role:approve"),
            "{refused}"
        );
    }

    #[test]
    fn a_call_no_rule_speaks_about_may_be_answered_by_anyone() {
        let policy = ApproverPolicy::compile(None, &[entry("shell(rm *)", &["olga"], None)])
            .expect("valid rules");
        let bob = principal("bob", "acme", &[Role::Approve]);
        assert_eq!(
            policy.may_answer("acme", &bob, "sam", "read_file", &json!({"path": "a"})),
            Ok(())
        );
        assert!(policy
            .may_answer("acme", &bob, "sam", "shell", &rm())
            .is_err());
    }

    #[test]
    fn a_tenant_rule_speaks_only_for_that_tenants_tasks_whoever_answers() {
        let policy = ApproverPolicy::compile(None, &[entry("shell", &["olga"], Some("acme"))])
            .expect("valid rules");
        let bob = principal("bob", "globex", &[Role::Approve]);
        assert_eq!(
            policy.may_answer("globex", &bob, "sam", "shell", &rm()),
            Ok(())
        );
        let operator = principal("root", EVERY_TENANT, &[Role::Approve, Role::Operate]);
        assert_eq!(
            policy.may_answer("globex", &operator, "sam", "shell", &rm()),
            Ok(())
        );
        let refused = policy
            .may_answer("acme", &operator, "sam", "shell", &rm())
            .expect_err("the rule speaks for acme's tasks, also to an operator");
        assert_eq!(
            refused,
            "root may not answer shell calls: approver rule 1 (shell, tenant acme) allows olga"
        );
        let olga = principal("olga", "acme", &[Role::Approve]);
        assert_eq!(
            policy.may_answer("acme", &olga, "sam", "shell", &rm()),
            Ok(())
        );
    }

    #[test]
    fn without_self_approval_the_submitter_may_not_answer_even_when_a_rule_names_them() {
        let policy = two_rules(Some(false));
        assert!(!policy.self_approval());
        let olga = principal("olga", "acme", &[Role::Approve]);
        let refused = policy
            .may_answer("acme", &olga, "olga", "shell", &rm())
            .expect_err("olga submitted the task");
        assert_eq!(
            refused,
            "olga may not answer a call of a task they submitted (self_approval = false)"
        );
        assert_eq!(
            policy.may_answer("acme", &olga, "sam", "shell", &rm()),
            Ok(())
        );
        assert_eq!(
            policy.may_answer("acme", &olga, "", "shell", &rm()),
            Ok(()),
            "an unknown submitter is nobody's own task"
        );
        let allowed = two_rules(Some(true));
        assert_eq!(
            allowed.may_answer("acme", &olga, "olga", "shell", &rm()),
            Ok(())
        );
    }

    #[test]
    fn bad_entries_are_refused_naming_their_number_and_fault() {
        let good = entry("*", &["role:approve"], None);
        for (bad, needle) in [
            (entry("shell(", &["olga"], None), "\"shell(\""),
            (entry("shell", &[], None), "by is empty"),
            (entry("shell", &["role:admin"], None), "\"role:admin\""),
            (entry("shell", &["role:"], None), "unknown role"),
            (entry("shell", &["ol ga"], None), "principal name"),
            (entry("shell", &["olga"], Some("ac me")), "tenant"),
            (entry("shell", &["olga"], Some(EVERY_TENANT)), "tenant"),
        ] {
            let err = ApproverPolicy::compile(None, &[good.clone(), bad.clone()])
                .expect_err(&format!("{bad:?}"));
            let message = err.to_string();
            assert!(message.starts_with("approver rule 2:"), "{message}");
            assert!(message.contains(needle), "{message}");
        }
        let roles = ["submit", "approve", "operate", "delegate"].map(|r| format!("role:{r}"));
        let every_role = ApproverEntry {
            by: roles.to_vec(),
            ..good
        };
        let policy = ApproverPolicy::compile(None, &[every_role]).expect("every role is known");
        let shown: Vec<String> = policy.rules()[0]
            .by()
            .iter()
            .map(Approver::to_string)
            .collect();
        assert_eq!(shown, roles);
    }
}
