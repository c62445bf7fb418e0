-- Extend the beat lock mid-tick, only for the beat that holds it (a tick that reads and plans
-- a family of many thousand new members at once outlasts the lock TTL otherwise). Never takes
-- the lock: a lock another beat holds stays its own, and a vacant one (expired, or vanished
-- with Redis's state) is taken back only by the next tick's lock step (tick.lua), which
-- decides whether it is taken at once or left to the beat that held it before a state loss.
-- KEYS[1] beat lock; ARGV[1] token, ARGV[2] ttl ms
-- Returns {1} when renewed, else {0, holder}: holder '' when no beat holds it.
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then return {0, holder or ''} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1}
