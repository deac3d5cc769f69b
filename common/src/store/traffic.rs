//! Model traffic shared by every lead and worker: a semaphore of leased slots per model, a fair
//! share of it between tenants, and a count of the tokens each model used per minute. Also the
//! cluster-wide cap on runs of a subagent type (`max_concurrency`): a semaphore of leased slots
//! per agent type, without tenant shares, taken by the workers that run it.
//!
//! Invariants:
//! - a model's slots are the members `tenant|holder` of `skein:model:{m}:slots`, scored by the
//!   expiry of their lease (Redis time, ms); a slot whose holder stops renewing is free once its
//!   lease expires, so a process that dies frees its slots without help;
//! - a call is admitted only while fewer than `limit` leases are live and its tenant holds fewer
//!   than its own limit (if it has one), and, while another tenant is waiting, only if its tenant
//!   holds fewer than its fair share `ceil(limit / tenants)` (`tenants`: those holding or waiting,
//!   the caller included) and no waiting tenant holds fewer, or as many while waiting longer: a
//!   freed slot goes to the tenant holding fewest, then to the one waiting longest, so a tenant
//!   that asks again at once cannot keep taking slots from one that waits;
//! - a tenant whose call is refused for want of a model slot is noted in
//!   `skein:model:{m}:waiting` for a short time, which the waiting call refreshes each time it
//!   asks again, and the time it started waiting in `skein:model:{m}:waiting_since` (cleared when
//!   it is admitted or stops waiting); a tenant refused by its own limit is not noted;
//! - with a token budget, no call is admitted while the model's (or the tenant's, on that model)
//!   tokens of the current minute have reached it; the tokens a call used are counted once it answered (a budget can be overrun by
//!   the calls already running, never by calls admitted after it was spent);
//! - a subagent type's runs are the members (holders) of `skein:agent:{a}:slots`, scored by lease
//!   expiry as a model's slots are; a run is admitted only while fewer than the cap are live.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{keys, lua::Lua, SessionStore, StoreError};

/// How long a minute's token count is kept: long enough to be read through the minute.
const TOKENS_TTL_SECS: i64 = 120;

/// Admits a call (1), refuses it for want of a slot (0) or of tokens (-1); see the invariants.
/// KEYS: slots, waiting, tokens of this minute, the tenant's tokens of this minute, when each
/// waiting tenant started waiting. ARGV: tenant, member, limit, lease ms, waiting note ms, tokens
/// per minute, the tenant's limit, the tenant's tokens per minute.
static ACQUIRE_SCRIPT: Lua = Lua::new(
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tenant, member = ARGV[1], ARGV[2]
local limit, lease, note = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local budget, tenant_limit, tenant_budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if budget > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') >= budget then
  return -1
end
if tenant_budget > 0 and tonumber(redis.call('GET', KEYS[4]) or '0') >= tenant_budget then
  return -1
end
if limit <= 0 and tenant_limit <= 0 then
  return 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZSCORE', KEYS[1], member) ~= false then
  return 1
end
local held, tenants = {}, 0
local holders = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, holder in ipairs(holders) do
  local owner = string.match(holder, '^([^|]*)|') or ''
  if not held[owner] then held[owner] = 0; tenants = tenants + 1 end
  held[owner] = held[owner] + 1
end
local mine = held[tenant] or 0
-- A tenant at its own limit waits for its own calls, not for the model: it is not noted.
if tenant_limit > 0 and mine >= tenant_limit then
  return 0
end
local admit = limit <= 0 or #holders < limit
if admit and limit > 0 then
  local since = {}
  local noted = redis.call('HGETALL', KEYS[5])
  for i = 1, #noted, 2 do
    if redis.call('ZSCORE', KEYS[2], noted[i]) == false then
      redis.call('HDEL', KEYS[5], noted[i])
    else
      since[noted[i]] = tonumber(noted[i + 1])
    end
  end
  -- A caller not waiting yet comes after every tenant that is (even one noted this millisecond).
  local my_since = since[tenant] or (now + 1)
  local others_wait = false
  for _, waiter in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    if waiter ~= tenant then
      others_wait = true
      if not held[waiter] then held[waiter] = 0; tenants = tenants + 1 end
      local theirs, their_since = held[waiter], since[waiter] or now
      -- A free slot goes to the tenant holding fewest, then to the one waiting longest.
      if theirs < mine or (theirs == mine and their_since < my_since) then admit = false end
    end
  end
  if not held[tenant] then tenants = tenants + 1 end
  if others_wait and mine >= math.ceil(limit / tenants) then admit = false end
end
if admit then
  redis.call('ZADD', KEYS[1], now + lease, member)
  redis.call('PEXPIRE', KEYS[1], lease * 2)
  redis.call('HDEL', KEYS[5], tenant)
  return 1
end
redis.call('ZADD', KEYS[2], now + note, tenant)
redis.call('PEXPIRE', KEYS[2], note * 2)
redis.call('HSETNX', KEYS[5], tenant, now)
redis.call('PEXPIRE', KEYS[5], note * 2)
return 0
",
);

/// Extends a live lease (1), or reports it gone (0). KEYS: slots. ARGV: member, lease ms.
static RENEW_SCRIPT: Lua = Lua::new(
    r"
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return 1
",
);

/// Admits a run of a subagent type (1) or refuses it, every slot being taken (0); a holder that
/// holds a slot already is admitted again (its lease extended). KEYS: slots. ARGV: member, limit,
/// lease ms.
static AGENT_ACQUIRE_SCRIPT: Lua = Lua::new(
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false
    and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return 1
",
);

/// Adds tokens to a minute's counts, the model's and the tenant's on it. KEYS: tokens of the
/// minute, the tenant's tokens of the minute. ARGV: tokens, ttl seconds.
static COUNT_TOKENS_SCRIPT: Lua = Lua::new(
    r"
local total = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('INCRBY', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return total
",
);

/// One process's ask for a slot of a model.
#[derive(Debug, Clone)]
pub struct SlotRequest<'a> {
    pub model: &'a str,
    pub tenant: &'a str,
    /// Unique per call (a random id): the lease's name.
    pub holder: &'a str,
    /// Most calls in flight on the model at once; 0 for no limit.
    pub limit: u32,
    /// Most tokens the model may use per minute; 0 for no budget.
    pub tokens_per_minute: u64,
    /// Most calls of the tenant in flight on the model at once; 0 for no limit of its own.
    pub tenant_limit: u32,
    /// Most tokens the tenant may use on the model per minute; 0 for no budget of its own.
    pub tenant_tokens_per_minute: u64,
    /// How long the slot is held unless renewed.
    pub lease: Duration,
    /// How long a refused call counts its tenant as waiting unless it asks again.
    pub waiting_note: Duration,
}

/// The answer to a [`SlotRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The call holds a slot until it releases it or its lease expires.
    Admitted,
    /// Every slot is taken, or the caller's tenant holds its fair share while others wait.
    SlotsTaken,
    /// The model's tokens of this minute are spent.
    TokensSpent,
}

/// The current minute since the Unix epoch, by this process's clock.
pub fn current_minute() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs() / 60)
        .unwrap_or_default()
}

fn member(tenant: &str, holder: &str) -> String {
    format!("{tenant}|{holder}")
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl SessionStore {
    /// Asks for a slot of a model; see the module's invariants.
    pub async fn try_take_model_slot(
        &self,
        request: &SlotRequest<'_>,
    ) -> Result<Admission, StoreError> {
        let mut conn = self.connection.clone();
        let answer: i64 = ACQUIRE_SCRIPT
            .key(keys::model_slots(request.model))
            .key(keys::model_waiting(request.model))
            .key(keys::model_tokens(request.model, current_minute()))
            .key(keys::model_tenant_tokens(
                request.model,
                request.tenant,
                current_minute(),
            ))
            .key(keys::model_waiting_since(request.model))
            .arg(request.tenant)
            .arg(member(request.tenant, request.holder))
            .arg(request.limit)
            .arg(millis(request.lease))
            .arg(millis(request.waiting_note))
            .arg(request.tokens_per_minute)
            .arg(request.tenant_limit)
            .arg(request.tenant_tokens_per_minute)
            .invoke_async(&mut conn)
            .await?;
        match answer {
            1 => Ok(Admission::Admitted),
            0 => Ok(Admission::SlotsTaken),
            -1 => Ok(Admission::TokensSpent),
            _ => Err(StoreError::UnexpectedReply("the model slot script")),
        }
    }

    /// Extends a slot's lease; `false` when the lease had already expired (the slot is gone).
    pub async fn renew_model_slot(
        &self,
        model: &str,
        tenant: &str,
        holder: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let renewed: i64 = RENEW_SCRIPT
            .key(keys::model_slots(model))
            .arg(member(tenant, holder))
            .arg(millis(lease))
            .invoke_async(&mut conn)
            .await?;
        Ok(renewed == 1)
    }

    /// Frees a slot; freeing one that is gone does nothing.
    pub async fn release_model_slot(
        &self,
        model: &str,
        tenant: &str,
        holder: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = redis::cmd("ZREM")
            .arg(keys::model_slots(model))
            .arg(member(tenant, holder))
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Counts tokens a call of `tenant` used on a model against the current minute.
    pub async fn count_model_tokens(
        &self,
        model: &str,
        tenant: &str,
        tokens: u64,
    ) -> Result<(), StoreError> {
        if tokens == 0 {
            return Ok(());
        }
        let mut conn = self.connection.clone();
        let _: i64 = COUNT_TOKENS_SCRIPT
            .key(keys::model_tokens(model, current_minute()))
            .key(keys::model_tenant_tokens(model, tenant, current_minute()))
            .arg(tokens)
            .arg(TOKENS_TTL_SECS)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Asks for a slot of subagent type `agent`, capped at `limit` runs at once across the
    /// cluster; `true` when `holder` holds it (until released, or its lease expires unrenewed).
    pub async fn try_take_agent_slot(
        &self,
        agent: &str,
        holder: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let admitted: i64 = AGENT_ACQUIRE_SCRIPT
            .key(keys::agent_slots(agent))
            .arg(holder)
            .arg(limit)
            .arg(millis(lease))
            .invoke_async(&mut conn)
            .await?;
        Ok(admitted == 1)
    }

    /// Extends a subagent slot's lease; `false` when it had already expired (the slot is gone).
    pub async fn renew_agent_slot(
        &self,
        agent: &str,
        holder: &str,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.connection.clone();
        let renewed: i64 = RENEW_SCRIPT
            .key(keys::agent_slots(agent))
            .arg(holder)
            .arg(millis(lease))
            .invoke_async(&mut conn)
            .await?;
        Ok(renewed == 1)
    }

    /// Frees a subagent slot; freeing one that is gone does nothing.
    pub async fn release_agent_slot(&self, agent: &str, holder: &str) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = redis::cmd("ZREM")
            .arg(keys::agent_slots(agent))
            .arg(holder)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// The runs of subagent type `agent` holding a slot whose lease has not expired (by this
    /// process's clock; the scripts use Redis's).
    pub async fn agent_runs(&self, agent: &str) -> Result<u64, StoreError> {
        let mut conn = self.connection.clone();
        let live: u64 = redis::cmd("ZCOUNT")
            .arg(keys::agent_slots(agent))
            .arg(format!("({}", crate::protocol::now_ms()))
            .arg("+inf")
            .query_async(&mut conn)
            .await?;
        Ok(live)
    }
}
