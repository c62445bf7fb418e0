-- Shared by the scripts that read or edit a run or sched record (spliced in with
-- `-- include: record_format`). A record comes in two formats (core/records.py): version 1
-- names each field in full, version 2 (compact, SCHEDPROJ_COMPACT_RECORDS) by a short key.
-- A script names a field in full and asks here for the name the record's own format uses,
-- so it reads both formats and an edit keeps the format of the record it found. The table is
-- core/records.py SHORT_NAMES (run and sched fields together: no name is in both), checked
-- equal by tests/core/test_records.py.
local RECORD_FORMATS = {[1] = true, [2] = true}
local COMPACT_RECORD_FORMAT = 2
local RECORD_SHORT_NAMES = {
  last_run_at = 't', last_outcome = 'o', last_reason = 'r', last_task_id = 'i',
  backlog = 'b', runs = 'n', failures = 'f', running_task_id = 'ri',
  running_since = 'rs', running_until = 'ru', fence = 'fe', failing_since = 'fs',
  skipped_task_id = 'si', since = 's',
  inflight_task_id = 'i', inflight_deadline = 'd', last_dispatch_at = 't',
  dispatches = 'n', deferral = 'df', paused = 'p', missed_through = 'mt', missed = 'm',
}

-- The name field `name` has in a record of format `version` (nil: a version no table knows).
local function record_name(version, name)
  if version == COMPACT_RECORD_FORMAT then return RECORD_SHORT_NAMES[name] end
  return name
end

-- Field `name` of a decoded record, whichever its format.
local function record_get(rec, name)
  local key = record_name(rec.v, name)
  if key == nil then return nil end
  return rec[key]
end

-- Whether `version` is a record format this release reads.
local function record_format_known(version)
  return type(version) == 'number' and RECORD_FORMATS[version] == true
end

-- The format of a record's text as written by Python (its version first), 1 if it says none.
local function record_text_format(text)
  return tonumber(string.match(text, '^%s*{%s*"v"%s*:%s*(%d+)')) or 1
end
