-- Shared by the scripts that set a field in a stored record's JSON text (a run record, the
-- lease; spliced in with `-- include: record_field`). The text is edited, never decoded and
-- re-encoded: cjson.encode keeps 14 significant digits (1796405433.989978 becomes
-- 1796405433.99, 2^52 + 1 becomes 4.5035996273705e+15) and writes 1796405433.0 as an integer,
-- so every field a script does not mean to change stays as Python wrote it.
-- A record leaves out the in-flight marks while they are null (core/records.py: a million
-- lanes keep one each), so a field is set in place when the text has it and added before the
-- closing brace when it does not. Only top-level fields are meant (records hold no nested
-- object): a string value holding the name has its quotes escaped, so it never matches.

-- The index of the last character of the JSON value starting at `from`: a string up to its
-- closing quote (escapes skipped), an object or array up to its closing bracket, any other
-- value up to the comma or brace that ends it (a string may hold either: "a, b}").
local function record_value_end(record, from)
  local depth, i = 0, from
  while true do
    local at = string.find(record, '[\\"{}%[%],]', i)
    if not at then return #record end
    local c = string.sub(record, at, at)
    if c == '"' then
      local j = at + 1
      while true do
        local q = string.find(record, '["\\]', j)
        if not q then return #record end
        if string.sub(record, q, q) == '\\' then j = q + 2 else at = q break end
      end
      if depth == 0 then return at end
    elseif c == '{' or c == '[' then
      depth = depth + 1
    elseif c == '}' or c == ']' then
      if depth == 0 then return at - 1 end
      depth = depth - 1
      if depth == 0 then return at end
    elseif c == ',' and depth == 0 then
      return at - 1
    end
    i = at + 1
  end
end

-- `record` with its field `name` set to the JSON text `text` (every occurrence: a parser reads
-- the last of a duplicated field). Text that is not an object is left as given.
local function set_record_field(record, name, text)
  local pieces, pos = {}, 1
  while true do
    local _, key_end = string.find(record, '"' .. name .. '"%s*:%s*', pos)
    if not key_end then break end
    pieces[#pieces + 1] = string.sub(record, pos, key_end) .. text
    pos = record_value_end(record, key_end + 1) + 1
  end
  if #pieces > 0 then
    pieces[#pieces + 1] = string.sub(record, pos)
    return table.concat(pieces)
  end
  local close = string.find(record, '}%s*$')
  if not close then return record end
  local before = string.sub(record, 1, close - 1)
  local comma = string.find(before, '{%s*$') and '' or ','
  return before .. comma .. '"' .. name .. '":' .. text .. '}'
end

-- A number as record text, exactly: the caller's text when it is a JSON number (Python's
-- repr: 1796405433.0 stays a float), else the value to 17 significant digits (an integer
-- below 2^53 as one), which name every double. nil for anything but a finite number.
local function record_number(given)
  local value = tonumber(given)
  if value == nil or value ~= value or value == math.huge or value == -math.huge then
    return nil
  end
  if type(given) == 'string' then
    local mantissa = string.match(given, '^(.-)[eE][%-+]?%d+$') or given
    if (string.match(mantissa, '^%-?%d+$') or string.match(mantissa, '^%-?%d+%.%d+$'))
        and not string.match(mantissa, '^%-?0%d') then
      return given
    end
  end
  if value == math.floor(value) and math.abs(value) < 2^53 then
    return string.format('%d', value)
  end
  return string.format('%.17g', value)
end
