//! Spending budgets as data: the limits a task (or an agent definition) declares, the scope a
//! piece of work draws from, and what a task spent. The ledger lives in `store::budget` and the
//! layer that keeps it in `agent::middleware::budget`; this module only says what travels.
//!
//! Invariants:
//! - a [`Budget`] that passed [`Budget::check`] has positive, finite limits no larger than
//!   [`MAX_BUDGET_TOKENS`] and [`MAX_BUDGET_USD`], so its cost in nano-dollars is an exact integer
//!   in a Lua script;
//! - a task's budget can only tighten its agent's: each limit is the lower of the two
//!   ([`Budget::tightest`]);
//! - every model call of a task, its subagents' included, draws from one ledger, named by the
//!   [`BudgetScope`] that travels in `TaskOrigin`: the user's task and session.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{validate_token, Failure, FailureKind};

/// Largest `max_total_tokens` accepted (10^15).
pub const MAX_BUDGET_TOKENS: u64 = 1_000_000_000_000_000;
/// Largest `max_cost_usd` accepted: one million dollars.
pub const MAX_BUDGET_USD: f64 = 1_000_000.0;

/// Nano-dollars in a dollar: ledgers count cost in whole nano-dollars.
const NANOS_PER_USD: f64 = 1e9;

/// Spending limits of a task and its subagents; an absent limit does not apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Most model tokens (prompt and completion) the task may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<u64>,
    /// Most the task's model calls may cost, in US dollars (at the configured prices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

// A checked budget's limits are finite (JSON cannot even carry NaN), so equality is total.
impl Eq for Budget {}

impl Budget {
    /// Refuses limits that are zero, negative, not finite or too large.
    pub fn check(&self) -> Result<(), Failure> {
        let invalid = |message: String| Err(Failure::new(FailureKind::InvalidInput, message));
        if let Some(tokens) = self.max_total_tokens {
            if tokens == 0 || tokens > MAX_BUDGET_TOKENS {
                return invalid(format!(
                    "budget.max_total_tokens must be 1..={MAX_BUDGET_TOKENS}, got {tokens}"
                ));
            }
        }
        if let Some(usd) = self.max_cost_usd {
            if !(usd.is_finite() && usd > 0.0 && usd <= MAX_BUDGET_USD) {
                return invalid(format!(
                    "budget.max_cost_usd must be more than 0 and at most {MAX_BUDGET_USD}, got {usd}"
                ));
            }
        }
        Ok(())
    }

    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        self.max_total_tokens.is_none() && self.max_cost_usd.is_none()
    }

    /// Each limit the lower of the two budgets' (a limit set in only one of them applies);
    /// `None` when neither sets any.
    pub fn tightest(a: Option<&Budget>, b: Option<&Budget>) -> Option<Budget> {
        fn lower<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(if b < a { b } else { a }),
                (a, b) => a.or(b),
            }
        }
        let (a, b) = (
            a.copied().unwrap_or_default(),
            b.copied().unwrap_or_default(),
        );
        let budget = Budget {
            max_total_tokens: lower(a.max_total_tokens, b.max_total_tokens),
            max_cost_usd: lower(a.max_cost_usd, b.max_cost_usd),
        };
        (!budget.is_empty()).then_some(budget)
    }

    /// The cost limit in nano-dollars, if there is one.
    pub fn max_cost_nanos(&self) -> Option<u64> {
        self.max_cost_usd.map(usd_to_nanos)
    }
}

/// The ledger a piece of work draws from: the user's task that started it, so a subagent's calls
/// count against its parent's budget. Its keys live with that task's session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetScope {
    /// The user's task whose budget this is.
    pub task_id: String,
    /// That task's session (the user's session, also for the calls of its subagents).
    pub session: String,
    pub limits: Budget,
}

impl BudgetScope {
    /// Checks a scope that arrived in a message: its names must be tokens (they name Redis
    /// keys) and its limits must pass [`Budget::check`].
    pub fn check(&self) -> Result<(), Failure> {
        validate_token("budget.task_id", &self.task_id)?;
        validate_token("budget.session", &self.session)?;
        self.limits.check()
    }
}

/// What a task's model calls (its subagents' included) spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Spent {
    /// Model tokens used, prompt and completion.
    pub tokens: u64,
    /// Their cost in US dollars, at the configured prices.
    pub cost_usd: f64,
}

impl Spent {
    /// Amounts as a ledger keeps them (cost in nano-dollars).
    pub fn from_ledger(tokens: u64, cost_nanos: u64) -> Self {
        Self {
            tokens,
            cost_usd: nanos_to_usd(cost_nanos),
        }
    }
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} tokens and {}", self.tokens, Usd(self.cost_usd))
    }
}

/// A dollar amount for people: cents when it is that large, else the significant digits.
#[derive(Debug, Clone, Copy)]
pub struct Usd(pub f64);

impl std::fmt::Display for Usd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == 0.0 || self.0.abs() >= 0.01 {
            write!(f, "${:.2}", self.0)
        } else {
            write!(f, "${:.6}", self.0)
        }
    }
}

/// Dollars as whole nano-dollars (rounded; negative and NaN count as 0).
pub fn usd_to_nanos(usd: f64) -> u64 {
    let nanos = (usd * NANOS_PER_USD).round();
    if nanos.is_nan() || nanos <= 0.0 {
        0
    } else if nanos >= u64::MAX as f64 {
        u64::MAX
    } else {
        nanos as u64
    }
}

/// Nano-dollars as dollars.
pub fn nanos_to_usd(nanos: u64) -> f64 {
    nanos as f64 / NANOS_PER_USD
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tokens: Option<u64>, usd: Option<f64>) -> Budget {
        Budget {
            max_total_tokens: tokens,
            max_cost_usd: usd,
        }
    }

    #[test]
    fn limits_must_be_positive_finite_and_bounded() {
        for bad in [
            budget(Some(0), None),
            budget(Some(MAX_BUDGET_TOKENS + 1), None),
            budget(None, Some(0.0)),
            budget(None, Some(-1.0)),
            budget(None, Some(f64::INFINITY)),
            budget(None, Some(f64::NAN)),
            budget(None, Some(MAX_BUDGET_USD * 2.0)),
        ] {
            let refused = bad.check().expect_err("refused");
            assert_eq!(refused.kind, FailureKind::InvalidInput, "{bad:?}");
        }
        for good in [
            budget(None, None),
            budget(Some(1), None),
            budget(None, Some(0.000_001)),
            budget(Some(MAX_BUDGET_TOKENS), Some(MAX_BUDGET_USD)),
        ] {
            assert!(good.check().is_ok(), "{good:?}");
        }
    }

    #[test]
    fn the_tightest_budget_takes_each_lower_limit() {
        let agent = budget(Some(1000), Some(2.0));
        let task = budget(Some(5000), Some(0.5));
        assert_eq!(
            Budget::tightest(Some(&agent), Some(&task)),
            Some(budget(Some(1000), Some(0.5)))
        );
        // A limit only one of them sets applies; none at all is no budget.
        let only_tokens = budget(Some(10), None);
        let only_cost = budget(None, Some(1.0));
        assert_eq!(
            Budget::tightest(Some(&only_tokens), Some(&only_cost)),
            Some(budget(Some(10), Some(1.0)))
        );
        assert_eq!(Budget::tightest(None, Some(&only_cost)), Some(only_cost));
        assert_eq!(Budget::tightest(None, None), None);
        assert_eq!(Budget::tightest(Some(&Budget::default()), None), None);
    }

    #[test]
    fn costs_round_trip_through_nano_dollars() {
        assert_eq!(usd_to_nanos(1.5), 1_500_000_000);
        assert_eq!(usd_to_nanos(0.000_000_001), 1);
        assert_eq!(usd_to_nanos(-3.0), 0);
        assert_eq!(usd_to_nanos(f64::NAN), 0);
        assert_eq!(usd_to_nanos(MAX_BUDGET_USD), 1_000_000_000_000_000);
        assert_eq!(nanos_to_usd(2_500_000_000), 2.5);
        assert_eq!(Spent::from_ledger(7, 1_230_000).cost_usd, 0.00123);
    }

    #[test]
    fn amounts_read_well() {
        assert_eq!(Usd(1.234).to_string(), "$1.23");
        assert_eq!(Usd(0.0).to_string(), "$0.00");
        assert_eq!(Usd(0.000_123_4).to_string(), "$0.000123");
        assert_eq!(
            Spent {
                tokens: 36,
                cost_usd: 14.0
            }
            .to_string(),
            "36 tokens and $14.00"
        );
    }

    #[test]
    fn a_tasks_scope_is_its_budget_held_to_its_agents() {
        let mut task: super::super::TaskSubmission = serde_json::from_value(serde_json::json!({
            "v": 1, "task_id": "t1", "tenant": "acme", "user": "u", "session": "s1",
            "agent": "assistant", "input": "hi",
            "budget": { "max_total_tokens": 5000, "max_cost_usd": 0.5 }
        }))
        .expect("a submission with a budget decodes");
        let agent = budget(Some(1000), None);
        let scope = task.budget_scope(Some(&agent)).expect("a scope");
        assert_eq!(
            (scope.task_id.as_str(), scope.session.as_str()),
            ("t1", "s1")
        );
        assert_eq!(scope.limits, budget(Some(1000), Some(0.5)));
        assert_eq!(
            task.origin().budget.map(|s| s.limits),
            Some(budget(Some(5000), Some(0.5)))
        );
        task.budget = None;
        assert_eq!(task.budget_scope(None), None);
        assert_eq!(
            task.budget_scope(Some(&agent)).map(|s| s.limits),
            Some(agent)
        );
    }

    #[test]
    fn a_scope_names_only_tokens() {
        let scope = BudgetScope {
            task_id: "t1".into(),
            session: "s1".into(),
            limits: budget(Some(10), None),
        };
        assert!(scope.check().is_ok());
        let forged = BudgetScope {
            session: "s1}:x".into(),
            ..scope.clone()
        };
        assert!(forged.check().is_err());
        let bad_limits = BudgetScope {
            limits: budget(Some(0), None),
            ..scope
        };
        assert!(bad_limits.check().is_err());
    }
}
