//! Spending ledgers shared by every lead and worker: a task's budget (its subagents draw from the
//! same ledger) and a tenant's daily budget. Each model call reserves its worst case before it
//! starts and settles with what it really used after.
//!
//! Invariants:
//! - a ledger is two keys with one hash tag: a hash of what was spent (`tokens`, `cost` in
//!   nano-dollars) and what is held (`held_tokens`, `held_cost`), and a sorted set of the
//!   reservations (`id|tokens|cost`) scored by when they lapse (Redis time, ms). A task's ledger
//!   lives with the user's session (`{tenant:session}`), a tenant's daily one under `{tenant}`;
//!   no script touches keys of two tags, so every script is valid on Redis Cluster;
//! - a reservation is granted only if, for each limit set, spent + held + the reservation stays
//!   within it; granting and refusing are one script, so two callers can never both take the
//!   last of a budget; a reservation is held once however often its script runs (a request
//!   retried after its reply was lost finds it held and is granted again);
//! - settling removes the reservation (if still there) and adds what the call used, which may be
//!   more or less than it held: a budget can be overrun only by calls that used more than their
//!   worst case, never by calls admitted after it was spent;
//! - a reservation its holder never settles (the process died mid-call) lapses after its lease:
//!   the next reservation on the ledger drops it and gives back what it held;
//! - the amounts are integers well below 2^53 (`protocol::budget` bounds the limits), exact in
//!   Lua; they reach Redis as the strings the caller wrote, never as Lua numbers.

use std::time::{Duration, SystemTime};

use super::{keys, lua::Lua, SessionStore, StoreError};
use crate::protocol::{BudgetScope, Spent};

/// How long a task's ledger lives after its last change: as long as its results.
const TASK_LEDGER_TTL_SECS: u64 = 7 * 24 * 3600;
/// How long a tenant's daily ledger lives: through its day, wherever the clocks stand.
const DAY_LEDGER_TTL_SECS: u64 = 2 * 24 * 3600;

/// The Lua function `give_back(member)` both scripts start with: takes a reservation's amounts
/// (its member `id|tokens|cost`) off the held amounts of the ledger (KEYS[1]). The amounts reach
/// HINCRBY as the digits the member holds; a zero is skipped, as Redis does not read `-0` as an
/// integer. A macro, so `concat!` can join it to each script.
macro_rules! give_back {
    () => {
        r"
local function give_back(member)
  local tokens, cost = string.match(member, '|(%d+)|(%d+)$')
  if tokens and tokens ~= '0' then
    redis.call('HINCRBY', KEYS[1], 'held_tokens', '-' .. tokens)
  end
  if cost and cost ~= '0' then
    redis.call('HINCRBY', KEYS[1], 'held_cost', '-' .. cost)
  end
end
"
    };
}

/// Grants a reservation (reply `{0, ...}`) or refuses it (`{1 over tokens, 2 over cost, 3
/// both, ...}`), after dropping lapsed reservations. The rest of the reply is the ledger as the
/// decision saw it: spent tokens, spent cost, held tokens, held cost.
/// KEYS: ledger hash, reservations. ARGV: member (`id|tokens|cost`), tokens, cost, token limit,
/// cost limit (0: none), lease ms, ttl s.
static RESERVE_SCRIPT: Lua = Lua::new(concat!(
    give_back!(),
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, lapsed in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  give_back(lapsed)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local ledger = redis.call('HMGET', KEYS[1], 'tokens', 'cost', 'held_tokens', 'held_cost')
local spent_tokens, spent_cost = tonumber(ledger[1] or '0'), tonumber(ledger[2] or '0')
local held_tokens, held_cost = tonumber(ledger[3] or '0'), tonumber(ledger[4] or '0')
-- Held already (the script ran twice for one reservation, a request retried after a lost
-- reply): granted, and not held twice.
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {0, spent_tokens, spent_cost, held_tokens, held_cost}
end
local tokens, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
local token_limit, cost_limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local over = 0
if token_limit > 0 and spent_tokens + held_tokens + tokens > token_limit then over = over + 1 end
if cost_limit > 0 and spent_cost + held_cost + cost > cost_limit then over = over + 2 end
if over == 0 then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'held_tokens', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'held_cost', ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[7])
  redis.call('EXPIRE', KEYS[2], ARGV[7])
end
return {over, spent_tokens, spent_cost, held_tokens, held_cost}
"
));

/// Ends a reservation: removes it if it has not lapsed (giving back what it held) and adds what
/// the call used. Replies with the ledger's spent tokens and cost.
/// KEYS: ledger hash, reservations. ARGV: member, used tokens, used cost, ttl s.
static SETTLE_SCRIPT: Lua = Lua::new(concat!(
    give_back!(),
    r"
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  give_back(ARGV[1])
end
local spent_tokens = redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[2])
local spent_cost = redis.call('HINCRBY', KEYS[1], 'cost', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {spent_tokens, spent_cost}
"
));

/// Limits of one ledger; 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerLimits {
    pub tokens: u64,
    pub cost_nanos: u64,
}

impl LedgerLimits {
    pub fn is_off(&self) -> bool {
        self.tokens == 0 && self.cost_nanos == 0
    }
}

/// Which ledger a reservation is made on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerName {
    /// The budget of a user's task (and its subagents).
    Task { tenant: String, scope: BudgetScope },
    /// A tenant's budget for one UTC day (`YYYY-MM-DD`).
    TenantDay { tenant: String, day: String },
}

/// One ledger: its keys, its limits and how long it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    pub name: LedgerName,
    pub limits: LedgerLimits,
}

impl Ledger {
    /// The ledger of the task `scope` names, under the scope's limits.
    pub fn task(tenant: &str, scope: &BudgetScope) -> Self {
        Self {
            limits: LedgerLimits {
                tokens: scope.limits.max_total_tokens.unwrap_or(0),
                cost_nanos: scope.limits.max_cost_nanos().unwrap_or(0),
            },
            name: LedgerName::Task {
                tenant: tenant.to_owned(),
                scope: scope.clone(),
            },
        }
    }

    /// The ledger of `tenant`'s current UTC day, under `limits`.
    pub fn tenant_today(tenant: &str, limits: LedgerLimits) -> Self {
        Self {
            name: LedgerName::TenantDay {
                tenant: tenant.to_owned(),
                day: current_day(),
            },
            limits,
        }
    }

    /// The ledger's hash and its reservations, in one hash tag.
    fn keys(&self) -> (String, String) {
        match &self.name {
            LedgerName::Task { tenant, scope } => (
                keys::budget(tenant, &scope.session, &scope.task_id),
                keys::budget_held(tenant, &scope.session, &scope.task_id),
            ),
            LedgerName::TenantDay { tenant, day } => (
                keys::tenant_budget(tenant, day),
                keys::tenant_budget_held(tenant, day),
            ),
        }
    }

    fn ttl_secs(&self) -> u64 {
        match self.name {
            LedgerName::Task { .. } => TASK_LEDGER_TTL_SECS,
            LedgerName::TenantDay { .. } => DAY_LEDGER_TTL_SECS,
        }
    }
}

/// What one model call holds until it settles: its worst case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Unique per call (a random id, no `|`).
    pub id: String,
    pub tokens: u64,
    pub cost_nanos: u64,
    /// How long the reservation stands if its holder never settles it.
    pub lease: Duration,
}

impl Hold {
    /// The reservation's member in the ledger's sorted set; it carries the amounts it holds.
    fn member(&self) -> String {
        format!("{}|{}|{}", self.id, self.tokens, self.cost_nanos)
    }
}

/// A ledger's amounts (cost in nano-dollars).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerState {
    pub spent_tokens: u64,
    pub spent_cost_nanos: u64,
    pub held_tokens: u64,
    pub held_cost_nanos: u64,
}

impl LedgerState {
    pub fn spent(&self) -> Spent {
        Spent::from_ledger(self.spent_tokens, self.spent_cost_nanos)
    }
}

/// The answer to a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// The worst case is held until settled (or until its lease lapses).
    Held,
    /// It would go over a limit; nothing is held.
    Refused {
        over_tokens: bool,
        over_cost: bool,
        /// The ledger as the decision saw it.
        ledger: LedgerState,
    },
}

/// Today's date by this process's clock, in UTC (`YYYY-MM-DD`).
pub fn current_day() -> String {
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    stamp.get(..10).unwrap_or(&stamp).to_owned()
}

/// A reply's numbers as `u64` (negative and missing ones as 0).
fn numbers<const N: usize>(reply: &[i64], what: &'static str) -> Result<[u64; N], StoreError> {
    if reply.len() != N {
        return Err(StoreError::UnexpectedReply(what));
    }
    let mut out = [0; N];
    for (slot, value) in out.iter_mut().zip(reply) {
        *slot = u64::try_from(*value).unwrap_or(0);
    }
    Ok(out)
}

impl SessionStore {
    /// Reserves `hold` on `ledger`; see the module's invariants.
    pub async fn reserve_budget(
        &self,
        ledger: &Ledger,
        hold: &Hold,
    ) -> Result<Reservation, StoreError> {
        let (spent, held) = ledger.keys();
        let mut conn = self.connection.clone();
        let reply: Vec<i64> = RESERVE_SCRIPT
            .key(spent)
            .key(held)
            .arg(hold.member())
            .arg(hold.tokens)
            .arg(hold.cost_nanos)
            .arg(ledger.limits.tokens)
            .arg(ledger.limits.cost_nanos)
            .arg(
                u64::try_from(hold.lease.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            )
            .arg(ledger.ttl_secs())
            .invoke_async(&mut conn)
            .await?;
        let [over, spent_tokens, spent_cost_nanos, held_tokens, held_cost_nanos] =
            numbers::<5>(&reply, "the budget reservation script")?;
        if over == 0 {
            return Ok(Reservation::Held);
        }
        Ok(Reservation::Refused {
            over_tokens: over & 1 != 0,
            over_cost: over & 2 != 0,
            ledger: LedgerState {
                spent_tokens,
                spent_cost_nanos,
                held_tokens,
                held_cost_nanos,
            },
        })
    }

    /// Ends `hold` on `ledger`, counting what the call used (0 and 0 when it failed); returns
    /// what the ledger has spent since.
    pub async fn settle_budget(
        &self,
        ledger: &Ledger,
        hold: &Hold,
        used_tokens: u64,
        used_cost_nanos: u64,
    ) -> Result<Spent, StoreError> {
        let (spent, held) = ledger.keys();
        let mut conn = self.connection.clone();
        let reply: Vec<i64> = SETTLE_SCRIPT
            .key(spent)
            .key(held)
            .arg(hold.member())
            .arg(used_tokens)
            .arg(used_cost_nanos)
            .arg(ledger.ttl_secs())
            .invoke_async(&mut conn)
            .await?;
        let [tokens, cost] = numbers::<2>(&reply, "the budget settle script")?;
        Ok(Spent::from_ledger(tokens, cost))
    }

    /// A ledger's amounts as they stand (reservations that lapsed still count as held until the
    /// next reservation drops them).
    pub async fn budget_ledger(&self, ledger: &Ledger) -> Result<LedgerState, StoreError> {
        let (spent, _) = ledger.keys();
        let mut conn = self.connection.clone();
        let fields: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(spent)
            .arg(&["tokens", "cost", "held_tokens", "held_cost"])
            .query_async(&mut conn)
            .await?;
        let mut amounts = [0u64; 4];
        for (amount, field) in amounts.iter_mut().zip(&fields) {
            // Held amounts dip below zero only between a lapse and its clean-up: read as 0.
            *amount = match field.as_deref() {
                None => 0,
                Some(text) => text
                    .parse::<i64>()
                    .map(|n| u64::try_from(n).unwrap_or(0))
                    .map_err(|_| StoreError::BadNumber {
                        what: "budget amount",
                        text: text.chars().take(64).collect(),
                    })?,
            };
        }
        let [spent_tokens, spent_cost_nanos, held_tokens, held_cost_nanos] = amounts;
        Ok(LedgerState {
            spent_tokens,
            spent_cost_nanos,
            held_tokens,
            held_cost_nanos,
        })
    }

    /// What the task `scope` names has spent so far, its subagents included.
    pub async fn budget_spent(
        &self,
        tenant: &str,
        scope: &BudgetScope,
    ) -> Result<Spent, StoreError> {
        let ledger = Ledger::task(tenant, scope);
        Ok(self.budget_ledger(&ledger).await?.spent())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Budget;

    #[test]
    fn a_tasks_ledger_keys_share_its_sessions_tag_and_a_days_share_the_tenants() {
        let scope = BudgetScope {
            task_id: "t1".into(),
            session: "s1".into(),
            limits: Budget {
                max_total_tokens: Some(100),
                max_cost_usd: Some(0.5),
            },
        };
        let task = Ledger::task("acme", &scope);
        assert_eq!(
            task.keys(),
            (
                "skein:{acme:s1}:budget:t1".to_owned(),
                "skein:{acme:s1}:budget:t1:held".to_owned()
            )
        );
        assert_eq!(
            task.limits,
            LedgerLimits {
                tokens: 100,
                cost_nanos: 500_000_000
            }
        );
        let day = Ledger {
            name: LedgerName::TenantDay {
                tenant: "acme".into(),
                day: "2030-01-02".into(),
            },
            limits: LedgerLimits::default(),
        };
        assert_eq!(
            day.keys(),
            (
                "skein:budget:{acme}:2030-01-02".to_owned(),
                "skein:budget:{acme}:2030-01-02:held".to_owned()
            )
        );
    }

    #[test]
    fn a_hold_names_its_amounts() {
        let hold = Hold {
            id: "abc".into(),
            tokens: 42,
            cost_nanos: 7,
            lease: Duration::from_secs(1),
        };
        assert_eq!(hold.member(), "abc|42|7");
    }

    #[test]
    fn today_is_a_date() {
        let day = current_day();
        assert_eq!(day.len(), 10, "{day}");
        assert_eq!(&day[4..5], "-");
        assert_eq!(&day[7..8], "-");
    }
}
