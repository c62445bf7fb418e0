-- Collect the garbage in Redis's Lua heap now (LaneStore.collect_script_garbage), once after a
-- beat's full read. That read's scripts build tables for every lane (about 85 MiB at 100,000
-- lanes) and leave them as garbage; Lua collects it a step at a time, each step paid by a later
-- script call, so every script call (the idle tick's included) cost more until it was gone:
-- about 800 ticks, 40 minutes at beat's 3 s loop (docs/performance.md). One full collection
-- costs Redis about 2.5 ms per MiB of garbage, once, beside a full read that costs seconds.
-- KEYS[1] the beat lock: unused, named so a cluster client sends this to the deployment's node.
-- Returns {KiB before, KiB after} as strings.
local before = collectgarbage('count')
collectgarbage('collect')
return {tostring(before), tostring(collectgarbage('count'))}
