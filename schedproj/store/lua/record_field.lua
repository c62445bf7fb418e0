-- Shared by the scripts that set a field in a run record's JSON text (spliced in with
-- `-- include: record_field`). A record leaves out the in-flight marks while they are null
-- (core/records.py: a million lanes keep one each), so a mark is set in place when the text
-- has it and added before the closing brace when it does not. Only top-level fields are
-- meant: a string value holding the name has its quotes escaped, so it never matches.
local function set_record_field(record, name, text)
  local pattern = '"' .. name .. '":[^,}]*'
  local replaced, found = string.gsub(record, pattern,
                                      function() return '"' .. name .. '":' .. text end)
  if found > 0 then return replaced end
  if string.sub(record, -1) ~= '}' then return record end  -- not an object: left as given
  return string.sub(record, 1, -2) .. ',"' .. name .. '":' .. text .. '}'
end
