-- A heavy run starts under its lease: only once per token, only while the token is current,
-- and only if the message comes from the beat that holds the beat lock now.
-- KEYS[1] lease, KEYS[2] beat fence counter, KEYS[3] epoch record (see epoch.lua)
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] now (s), ARGV[4] the beat fence the message carries
-- ('' = not checked: tests and operator tools),
-- ARGV[5] holder host, ARGV[6] holder pid, ARGV[7] holder worker node name,
-- ARGV[8] the lane the worker runs, ARGV[9] its message's task id ('' = not checked: tests
-- and operator tools)
-- A token is the grant of one message of one lane: a hand-made message for another lane (or
-- another task id) that carries it starts nothing and leaves the grant to its own message.
-- A message from a beat that has since lost its lock (frozen between recording and sending,
-- say) starts nothing, and frees the lease it was granted so the current beat can grant again.
-- The holder's identity lets a worker restarted on the same node free the lease of a
-- predecessor it can prove dead.
-- Nothing starts while Redis may have lost state (the same check as lease_acquire.lua: epoch
-- missing, another server process, or in quarantine), nor under a grant made in an earlier
-- epoch generation (before a loss: a failover to a replica that has the grant and the message
-- but not the start would otherwise run the message a second time). These refusals leave the
-- lease alone: a run that started before the loss may hold it.
-- Returns {1, fence} or {0, reason} with reason gone | taken | wrong-lane | wrong-task |
-- already-started | stale-beat | epoch-unknown | server-changed | quarantine | stale-epoch.
--
-- Marking the run record in the same call (a worker's start in one round trip, issue 23: 3):
-- KEYS[4] lanes hash, KEYS[5] changed set, KEYS[6] run journal (absent: journaled by the caller);
-- ARGV[10] run field, ARGV[11] the record the caller expects there ('' = the field absent),
-- ARGV[12] the record marked running (computed by the caller from the expected one:
-- schedproj.core.lifecycle.started, one implementation of the rule), ARGV[13] lane name,
-- ARGV[14] the fence the caller computed it with, ARGV[15] the journal's 'start' entry,
-- ARGV[16] the journal's length. Only once started, and only if the stored record is still
-- exactly the expected one and the grant's fence is the one assumed: then the record is
-- written (the lane marked changed for beat) and the entry journaled, as run_cas.lua would
-- (a compare and set). Otherwise nothing more is written and the reply carries what is stored,
-- for the caller's own compare and set: {1, fence, 'marked'} ('marked-unjournaled' when the
-- journal refused the entry) or {1, fence, 'changed', raw}
-- (raw false: absent); ARGV[12] '' only reads it (the caller knows no record to expect).
-- Without KEYS[4] the reply is {1, fence} as before.
-- The epoch check lease_acquire.lua makes: nil when state is known intact, else the reason.
-- include: epoch_refusal
-- include: record_field
local current = redis.call('GET', KEYS[1])
if not current then return {0, 'gone'} end
local ok, rec = pcall(cjson.decode, current)
if not ok or type(rec) ~= 'table' then return {0, 'gone'} end
if rec.token ~= ARGV[1] then return {0, 'taken'} end
if ARGV[8] ~= '' and rec.lane ~= ARGV[8] then return {0, 'wrong-lane'} end
if ARGV[9] ~= '' and (rec.task_id or '') ~= '' and rec.task_id ~= ARGV[9] then
  return {0, 'wrong-task'}
end
if rec.started_at then return {0, 'already-started'} end
local refusal, epoch = epoch_refusal(KEYS[3])
if refusal then return {0, refusal} end
if rec.epoch ~= epoch.gen then return {0, 'stale-epoch'} end
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then
  redis.call('DEL', KEYS[1])
  return {0, 'stale-beat'}
end
-- Set in the lease's text (record_field.lua): a cjson round trip cut granted_at and
-- started_at to 10 ms and a fence past 14 digits, so the lease no longer named its fence.
local lease = current
local started_at, pid = record_number(ARGV[3]), record_number(ARGV[6])
if started_at then lease = set_record_field(lease, 'started_at', started_at) end
lease = set_record_field(lease, 'host', cjson.encode(ARGV[5]))
if pid then lease = set_record_field(lease, 'pid', pid) end
lease = set_record_field(lease, 'node', cjson.encode(ARGV[7]))
redis.call('SET', KEYS[1], lease, 'PX', ARGV[2])
if not KEYS[4] then return {1, rec.fence} end
-- A lanes hash of the wrong type answers as a changed record: the caller's own compare and
-- set meets the error and says so, as it did before the two were one call.
local stored = redis.pcall('HGET', KEYS[4], ARGV[10])
if type(stored) == 'table' then return {1, rec.fence, 'changed', false} end
if ARGV[12] == '' or (stored or '') ~= ARGV[11] or rec.fence ~= tonumber(ARGV[14]) then
  return {1, rec.fence, 'changed', stored}
end
redis.call('HSET', KEYS[4], ARGV[10], ARGV[12])
redis.pcall('SADD', KEYS[5], ARGV[13])  -- a changed set of the wrong type: beat heals it
if KEYS[6] then
  -- A journal of the wrong type must not stop the run (journaled apart, its failure logged).
  local pushed = redis.pcall('RPUSH', KEYS[6], ARGV[15])
  if type(pushed) == 'table' then return {1, rec.fence, 'marked-unjournaled'} end
  redis.pcall('LTRIM', KEYS[6], -tonumber(ARGV[16]), -1)
end
return {1, rec.fence, 'marked'}
