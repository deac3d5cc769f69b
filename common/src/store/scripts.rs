//! The Lua scripts of the session store: each runs in one trip and touches only keys of one
//! session (one hash slot), so a lease, a version check and the writes they guard are one step.
//! Messages are appended to a history 512 to a command (Lua's `unpack` takes a few thousand
//! values at most).

use super::lua::Lua;

/// Compare-and-set save: KEYS[1] session hash, KEYS[2] history list; ARGV expected version, new
/// version, state (without history), 'replace' or 'append', idle ttl seconds (0: none), offset
/// of the loaded history in the list afterwards, how many of the list's oldest messages to drop,
/// a value for KEYS[3] written with the save ('' for none; a subagent call's outcome), its ttl
/// seconds, then the messages to add.
pub(super) static SAVE_SCRIPT: Lua = Lua::new(
    r#"
local current = redis.call('HGET', KEYS[1], 'version')
if (current or '0') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3], 'offset', ARGV[6])
if ARGV[4] == 'replace' then redis.call('DEL', KEYS[2]) end
for i = 10, #ARGV, 512 do redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 511, #ARGV))) end
if ARGV[7] ~= '0' then redis.call('LTRIM', KEYS[2], ARGV[7], -1) end
if ARGV[5] ~= '0' then
  redis.call('EXPIRE', KEYS[1], ARGV[5])
  redis.call('EXPIRE', KEYS[2], ARGV[5])
else
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
end
if ARGV[8] ~= '' then redis.call('SET', KEYS[3], ARGV[8], 'EX', ARGV[9]) end
return 1
"#,
);

/// Ends a turn atomically while the writer holds the lease: saves the session (compare-and-set,
/// unless ARGV[4] is empty), stores the final result, drops the checkpoint and releases the lease.
/// A final result stored earlier (the task ended on another path meanwhile) stands: nothing is
/// saved, the lease is released and the stored final returned.
/// KEYS[1] session, KEYS[2] lease, KEYS[3] final, KEYS[4] checkpoint, KEYS[5] history list,
/// KEYS[6] turn records. ARGV token, expected version, new version, state (without history),
/// final, final ttl seconds, 'replace' or 'append', idle session ttl seconds (0: none), offset of
/// the loaded history in the list afterwards, how many of the list's oldest messages to drop, the
/// turn's record ('' for none: appended only with a saved session), most records kept, then the
/// messages to add to the history.
/// Returns {1} done, {0} version conflict, {-1} lease lost, {2, final} an earlier final stands.
pub(super) static COMPLETE_SCRIPT: Lua = Lua::new(
    r#"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {-1} end
local earlier = redis.call('GET', KEYS[3])
if earlier then
  redis.call('DEL', KEYS[4])
  redis.call('DEL', KEYS[2])
  return {2, earlier}
end
if ARGV[4] ~= '' then
  local current = redis.call('HGET', KEYS[1], 'version')
  if (current or '0') ~= ARGV[2] then return {0} end
  redis.call('HSET', KEYS[1], 'version', ARGV[3], 'state', ARGV[4], 'offset', ARGV[9])
  if ARGV[7] == 'replace' then redis.call('DEL', KEYS[5]) end
  for i = 13, #ARGV, 512 do redis.call('RPUSH', KEYS[5], unpack(ARGV, i, math.min(i + 511, #ARGV))) end
  if ARGV[10] ~= '0' then redis.call('LTRIM', KEYS[5], ARGV[10], -1) end
  if ARGV[11] ~= '' then
    redis.call('RPUSH', KEYS[6], ARGV[11])
    redis.call('LTRIM', KEYS[6], -tonumber(ARGV[12]), -1)
  end
end
if ARGV[8] ~= '0' then
  redis.call('EXPIRE', KEYS[1], ARGV[8])
  redis.call('EXPIRE', KEYS[5], ARGV[8])
  redis.call('EXPIRE', KEYS[6], ARGV[8])
end
redis.call('SET', KEYS[3], ARGV[5], 'EX', ARGV[6])
redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[2])
return {1}
"#,
);

/// Stores a final result unless one is stored already. KEYS[1] final; ARGV final, ttl seconds.
/// Returns false when stored now, or the final stored earlier.
pub(super) static STORE_FINAL_SCRIPT: Lua = Lua::new(
    r#"
local earlier = redis.call('GET', KEYS[1])
if earlier then return earlier end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return false
"#,
);

/// Starts a turn in one trip. KEYS[1] final result, KEYS[2] lease, KEYS[3] attempts, KEYS[4]
/// session, KEYS[5] the turn's checkpoints, KEYS[6] history (session and history kept while the
/// turn runs: an idle-session expiry must not strike mid-turn; the turn's end sets it again),
/// KEYS[7] the task's controls, KEYS[8] the task's trace, KEYS[9] the checkpoint as earlier
/// versions wrote it, KEYS[10] the delivery's event epoch counter; ARGV token, lease ttl ms,
/// attempts field, attempts ttl seconds, most attempts, the `traceparent` to keep as the task's
/// trace ('' for none: the submission carried its sender's; kept only if none is yet, and then
/// kept as long as the attempts), checkpoint ttl seconds, '1' to take the next event epoch (a
/// delivery's first start: the counter is raised whatever the start's outcome, and kept as long
/// as the attempts) or '' (a later start of the same delivery keeps the epoch it took). Taking
/// the lease names the caller the checkpoints' holder (field ''): the checkpoint the turn resumes
/// from (the previous holder's field) moves to the caller's field and every other field goes, so
/// what a lead that lost the lease writes later (into its own field) is never read; the hash's
/// expiry is set, so the holder's writes need not set it again for a while. Every reply leads
/// with the epoch taken ('' when none was asked for), then: {'finished', final}; {'busy'}
/// (another holds the lease; nothing counted; also when the lease is this caller's own, held by
/// an earlier run of the task); {'busy', 'unbounded'} (the lease had no expiry, which no lead
/// writes: it is given the lease ttl now, so it lapses then, as the lease of a lead that stopped
/// does); {'exhausted', n} (attempt n counted, over the limit, lease not taken); or {'started',
/// n, version, state, checkpoint, offset, paused, was_paused, interrupt, steered, history} with
/// the lease taken (the history from the offset on: what a summary stands for is not loaded;
/// absent controls as '').
pub(super) static BEGIN_SCRIPT: Lua = Lua::new(
    r#"
local epoch = ''
if ARGV[8] == '1' then
  epoch = tostring(redis.call('INCR', KEYS[10]))
  redis.call('EXPIRE', KEYS[10], ARGV[4])
end
local done = redis.call('GET', KEYS[1])
if done then return {epoch, 'finished', done} end
if ARGV[6] ~= '' and not redis.call('SET', KEYS[8], ARGV[6], 'NX', 'EX', ARGV[4]) then
  redis.call('EXPIRE', KEYS[8], ARGV[4])
end
local held = redis.call('PTTL', KEYS[2])
if held == -1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {epoch, 'busy', 'unbounded'}
end
if held ~= -2 then return {epoch, 'busy'} end
local n = redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
redis.call('EXPIRE', KEYS[3], ARGV[4])
if n > tonumber(ARGV[5]) then return {epoch, 'exhausted', tostring(n)} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local session = redis.call('HMGET', KEYS[4], 'version', 'state', 'offset')
redis.call('PERSIST', KEYS[4])
redis.call('PERSIST', KEYS[6])
local holder = redis.call('HGET', KEYS[5], '')
local checkpoint = false
if holder then
  checkpoint = redis.call('HGET', KEYS[5], holder)
else
  checkpoint = redis.call('GET', KEYS[9])
  if checkpoint then redis.call('DEL', KEYS[9]) end
end
if holder ~= ARGV[1] then
  redis.call('DEL', KEYS[5])
  if checkpoint then redis.call('HSET', KEYS[5], ARGV[1], checkpoint) end
  redis.call('HSET', KEYS[5], '', ARGV[1])
end
redis.call('EXPIRE', KEYS[5], ARGV[7])
local offset = session[3] or '0'
local history = redis.call('LRANGE', KEYS[6], tonumber(offset), -1)
local c = redis.call('HMGET', KEYS[7], 'paused', 'was_paused', 'interrupt', 'steered')
return {epoch, 'started', tostring(n), session[1] or '0', session[2] or '', checkpoint or '', offset,
  c[1] or '', c[2] or '', c[3] or '', c[4] or '', history}
"#,
);

/// Loads a session: KEYS[1] session hash, KEYS[2] history list. Returns {version, state, offset,
/// history from the offset on}.
pub(super) static LOAD_SCRIPT: Lua = Lua::new(
    r#"
local session = redis.call('HMGET', KEYS[1], 'version', 'state', 'offset')
local offset = session[3] or '0'
local history = redis.call('LRANGE', KEYS[2], tonumber(offset), -1)
return {session[1] or '0', session[2] or '', offset, history}
"#,
);

/// Takes a lease if it is free. KEYS[1] lease; ARGV token, ttl ms. Returns 1 (taken), 0 (held),
/// or -1 (held with no expiry, which no lead writes: given the ttl now, so it lapses then).
pub(super) static TRY_LEASE_SCRIPT: Lua = Lua::new(
    r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return -1
end
return 0
"#,
);

/// Deletes or extends a lease only if the caller still holds it. ARGV token, ttl ms (0 = release).
pub(super) static LEASE_SCRIPT: Lua = Lua::new(
    r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"#,
);
