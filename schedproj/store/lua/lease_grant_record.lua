-- Grant the heavy lease and record the dispatch in one call (issue 23: 3): lease_acquire.lua,
-- then - only if it granted - guarded_hset.lua, each the very script spliced in as a function
-- (one implementation of each rule), atomically. Both are guarded by the beat lock; the
-- records (the winner's in-flight dispatch among them) are written only with the grant, so a
-- refused grant writes nothing and the caller plans the tick again without its winner.
-- ARGV[1] how many of KEYS are lease_acquire.lua's (the rest are guarded_hset.lua's),
-- ARGV[2] how many of the ARGV after these two are lease_acquire.lua's (the rest likewise).
-- Returns {lease_acquire's reply, guarded_hset's reply (-2: not run, the grant refused)}; an
-- error reply of lease_acquire.lua (a garbage fence counter) is returned as it is.
local function acquire(KEYS, ARGV)
-- include: lease_acquire
end
local function record(KEYS, ARGV)
-- include: guarded_hset
end
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
local ak, aa, rk, ra = {}, {}, {}, {}
for i = 1, #KEYS do
  if i <= nk then ak[#ak + 1] = KEYS[i] else rk[#rk + 1] = KEYS[i] end
end
for i = 3, #ARGV do
  if i - 2 <= na then aa[#aa + 1] = ARGV[i] else ra[#ra + 1] = ARGV[i] end
end
local grant = acquire(ak, aa)
if grant.err then return grant end
if tonumber(grant[1]) ~= 1 then return {grant, -2} end
return {grant, record(rk, ra)}
