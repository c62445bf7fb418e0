-- An operator clears the heavy lease (schedproj clear-lease): never while its holder may run.
-- KEYS[1] lease, KEYS[2] operator request record
-- ARGV[1] token of the lease the operator judged, ARGV[2] 'unstarted' or 'started' (what the
-- operator's judgement was made on), ARGV[3] the request record to leave for beat ('' = none),
-- ARGV[4] its TTL in ms
-- 'unstarted': released only if the lease is still the same grant and still not started. A
-- worker starting it at the same moment either starts first (then this refuses: 'started')
-- or finds the lease gone (its message is then refused as stale): never both.
-- 'started': released only if it is still the same grant, started (the operator proved its
-- holder gone on the holder's own node); the request record tells beat the run was cleared.
-- Returns 'cleared', or why not: gone | taken | started | unstarted.
local current = redis.call('GET', KEYS[1])
if not current then return 'gone' end
local ok, rec = pcall(cjson.decode, current)
if not ok or type(rec) ~= 'table' or rec.token ~= ARGV[1] then return 'taken' end
local started = rec.started_at ~= nil and rec.started_at ~= cjson.null
if ARGV[2] == 'unstarted' and started then return 'started' end
if ARGV[2] == 'started' and not started then return 'unstarted' end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4]) end
return 'cleared'
