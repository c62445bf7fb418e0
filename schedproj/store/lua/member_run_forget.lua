-- The run records of removed family members deleted (FamilyStore.remove, inside its MULTI),
-- except a record that names a run in flight: that run still executes, and the member may be
-- added back before it ends (an operator's undo, a members hook whose list flaps for one
-- sync). `add` keeps a record it finds, so beat sees the run in flight and does not dispatch
-- the member again beside it; `run_finish.lua` deletes the kept record at the run's end if
-- the member is still removed. Read and decided in one step: a run that starts meanwhile is
-- either seen here or refused (its dispatch's sched record is deleted with the member).
-- KEYS[1] lanes hash; ARGV the run fields. Returns how many records were kept.
-- include: record_format
local kept = 0
for _, field in ipairs(ARGV) do
  local text = redis.call('HGET', KEYS[1], field)
  local running = false
  if text then
    local ok, rec = pcall(cjson.decode, text)
    running = ok and type(rec) == 'table' and type(record_get(rec, 'running_task_id')) == 'string'
  end
  if running then kept = kept + 1 else redis.call('HDEL', KEYS[1], field) end
end
return kept
