--- ember.report: the output side of every measurement script. One flat
-- record per result (JSON lines, machine-readable, append-only), a Markdown
-- table for people, CSV for spreadsheets and pandas, SVG line plots that need
-- nothing but a browser.
--
--   local report = require "ember.report"
--   local rec = report.record(config, results, "cuda")   -- + commit, device, driver, date, ...
--   report.append_jsonl("runs.jsonl", rec)
--   print(report.markdown_table({"model", {key = "mean_ms", title = "ms", fmt = "%.2f"}}, rows))
--
-- A missing value (nil or JSON null) prints as an empty cell; a string such
-- as "OOM" prints as it is, so a failed configuration still has its row.
local cjson = require "cjson"
local M = {}

-- ---------------------------------------------------------------------------
-- values

--- True for nil and for JSON null (what cjson decodes `null` to).
function M.missing(v)
  return v == nil or v == cjson.null
end

--- A value as a short human string: integers whole, others to 4 significant
-- figures (thousands and up without decimals), tables as compact JSON.
function M.format_value(v)
  if M.missing(v) then return "" end
  local t = type(v)
  if t == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    if math.type(v) == "integer" then return tostring(v) end
    local a = math.abs(v)
    if v == math.floor(v) and a < 1e15 then return ("%d"):format(v) end
    if a >= 1000 and a < 1e15 then return ("%.0f"):format(v) end
    if a >= 1e-4 or a == 0 then return ("%.4g"):format(v) end
    return ("%.3g"):format(v)
  end
  if t == "table" then
    local ok, s = pcall(cjson.encode, v)
    return ok and s or tostring(v)
  end
  return tostring(v)
end

-- Columns are {key=, title=, fmt=, value=} or plain keys. `value(row)`
-- computes a derived column (GiB from bytes, the first of several samples).
local function normalize_columns(columns, fname)
  if type(columns) ~= "table" then
    error(("ember.report.%s: expected a list of columns, got %s"):format(fname, type(columns)), 3)
  end
  local out = {}
  for i, c in ipairs(columns) do
    if type(c) == "string" then c = {key = c} end
    if type(c) ~= "table" or (c.key == nil and c.value == nil) then
      error(("ember.report.%s: column %d: expected a key string or {key=, title=, fmt=}, got %s")
        :format(fname, i, type(c) == "table" and "a table without key or value" or type(c)), 3)
    end
    out[i] = {key = c.key, title = c.title or c.key or ("column " .. i), fmt = c.fmt, value = c.value}
  end
  return out
end
M.normalize_columns = function(columns) return normalize_columns(columns, "normalize_columns") end

local function cell_value(col, row)
  if col.value then return col.value(row) end
  return row[col.key]
end

--- The display string of one cell: `fmt` applies to numbers only, so an
-- "OOM" in a column of milliseconds is shown as it is.
local function cell_text(col, row)
  local v = cell_value(col, row)
  if M.missing(v) then return "" end
  if type(col.fmt) == "function" then return tostring(col.fmt(v, row)) end
  if type(col.fmt) == "string" and type(v) == "number" then return col.fmt:format(v) end
  return M.format_value(v)
end

-- ---------------------------------------------------------------------------
-- Markdown

local function width(s)
  return utf8.len(s) or #s
end

local function md_escape(s)
  return (s:gsub("|", "\\|"):gsub("\r?\n", " "))
end

--- A Markdown (GFM) table. Columns whose values are mostly numbers are
-- right-aligned (an "OOM" among milliseconds does not change that); cells
-- are padded so the raw text lines up too.
function M.markdown_table(columns, rows)
  local cols = normalize_columns(columns, "markdown_table")
  rows = rows or {}
  local cells, widths, numeric, nums, others = {}, {}, {}, {}, {}
  for j, c in ipairs(cols) do
    widths[j], nums[j], others[j] = math.max(3, width(md_escape(c.title))), 0, 0
  end
  for i, row in ipairs(rows) do
    cells[i] = {}
    for j, c in ipairs(cols) do
      local v = cell_value(c, row)
      if type(v) == "number" then nums[j] = nums[j] + 1
      elseif not M.missing(v) then others[j] = others[j] + 1 end
      local s = md_escape(cell_text(c, row))
      cells[i][j] = s
      widths[j] = math.max(widths[j], width(s))
    end
  end
  for j = 1, #cols do numeric[j] = nums[j] > 0 and nums[j] >= others[j] end
  local function line(items)
    local parts = {}
    for j, s in ipairs(items) do
      local pad = (" "):rep(widths[j] - width(s))
      parts[j] = numeric[j] and (pad .. s) or (s .. pad)
    end
    return "| " .. table.concat(parts, " | ") .. " |"
  end
  local titles, rule = {}, {}
  for j, c in ipairs(cols) do
    titles[j] = md_escape(c.title)
    rule[j] = numeric[j] and (("-"):rep(widths[j] - 1) .. ":") or (":" .. ("-"):rep(widths[j] - 1))
  end
  local out = {line(titles), "| " .. table.concat(rule, " | ") .. " |"}
  for i = 1, #rows do out[#out + 1] = line(cells[i]) end
  return table.concat(out, "\n") .. "\n"
end

--- A Markdown table of cells already formatted as strings (headers: a list
-- of titles, rows: lists of strings), columns padded to their widest cell.
-- For scripts that format each cell themselves ("8.71 ± 0.03", "OOM").
function M.text_table(headers, rows)
  local width = {}
  for i, h in ipairs(headers) do width[i] = utf8.len(h) end
  for _, row in ipairs(rows) do
    for i, c in ipairs(row) do width[i] = math.max(width[i], utf8.len(c)) end
  end
  local function line(cells)
    local parts = {}
    for i, c in ipairs(cells) do parts[i] = c .. (" "):rep(width[i] - utf8.len(c)) end
    return "| " .. table.concat(parts, " | ") .. " |"
  end
  local out, rule = {line(headers)}, {}
  for i = 1, #headers do rule[i] = ("-"):rep(width[i]) end
  out[2] = line(rule)
  for _, row in ipairs(rows) do out[#out + 1] = line(row) end
  return table.concat(out, "\n")
end

-- ---------------------------------------------------------------------------
-- CSV (RFC 4180: CRLF line ends, fields with , " CR LF quoted, quotes doubled)

local function csv_field(v)
  local s
  if M.missing(v) then s = ""
  elseif type(v) == "table" then s = M.format_value(v)
  else s = tostring(v) end
  if s:find('[,"\r\n]') then s = '"' .. s:gsub('"', '""') .. '"' end
  return s
end

--- CSV text: a header of keys (titles for computed columns), then raw values
-- (full precision, no `fmt`: the CSV is for machines).
function M.csv(columns, rows)
  local cols = normalize_columns(columns, "csv")
  local lines, head = {}, {}
  for j, c in ipairs(cols) do head[j] = csv_field(c.key or c.title) end
  lines[1] = table.concat(head, ",")
  for i, row in ipairs(rows or {}) do
    local f = {}
    for j, c in ipairs(cols) do f[j] = csv_field(cell_value(c, row)) end
    lines[i + 1] = table.concat(f, ",")
  end
  return table.concat(lines, "\r\n") .. "\r\n"
end

--- Write `text` to `path` through a temporary file and a rename, so a reader
-- never sees half a file.
function M.write_file(path, text)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("ember.report: cannot write " .. path .. ": " .. tostring(err), 2) end
  f:write(text)
  f:close()
  local ok, rerr = os.rename(tmp, path)
  if not ok then error("ember.report: cannot write " .. path .. ": " .. tostring(rerr), 2) end
end

function M.write_csv(path, columns, rows)
  M.write_file(path, M.csv(columns, rows))
end

-- ---------------------------------------------------------------------------
-- JSON lines

-- JSON has no NaN/Inf and no functions: write those as strings / leave them out.
local function sanitize(v, depth)
  local t = type(v)
  if t == "number" then
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    return v
  elseif t == "table" then
    if depth > 32 then return nil end
    local out = {}
    for k, x in pairs(v) do out[k] = sanitize(x, depth + 1) end
    return out
  elseif t == "string" or t == "boolean" or v == cjson.null then
    return v
  end
  return nil
end

--- Append one record as one JSON line. A file whose last line was cut short
-- (a killed writer) gets a newline first, so the new record stays readable.
function M.append_jsonl(path, record)
  local line = cjson.encode(sanitize(record, 0))
  local prev = io.open(path, "rb")
  local sep = ""
  if prev then
    local size = prev:seek("end")
    if size > 0 then
      prev:seek("set", size - 1)
      if prev:read(1) ~= "\n" then sep = "\n" end
    end
    prev:close()
  end
  local f, err = io.open(path, "ab")
  if not f then error("ember.report.append_jsonl: cannot open " .. path .. ": " .. tostring(err), 2) end
  f:write(sep, line, "\n")
  f:close()
end

-- cjson decodes every number as a float; 128 should come back as 128.
local function integers(v)
  if type(v) == "number" then return math.tointeger(v) or v end
  if type(v) == "table" then
    for k, x in pairs(v) do v[k] = integers(x) end
  end
  return v
end

--- Records of a JSON-lines file, and a list of problems (lines that do not
-- parse: a truncated last line, say), which are skipped, not fatal.
-- Returns nil, message when the file cannot be opened.
function M.read_jsonl(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, "cannot open " .. path .. ": " .. tostring(err) end
  local text = f:read("a")
  f:close()
  local records, problems, n = {}, {}, 0
  local lines = {}
  for line in text:gmatch("([^\n]*)\n?") do lines[#lines + 1] = line end
  if lines[#lines] == "" then lines[#lines] = nil end
  for i, line in ipairs(lines) do
    if line:match("%S") then
      local ok, rec = pcall(cjson.decode, line)
      if ok and type(rec) == "table" then
        n = n + 1
        records[n] = integers(rec)
      else
        local what = i == #lines and not text:match("\n$") and "truncated last line" or "unreadable line"
        problems[#problems + 1] = ("%s:%d: %s skipped (%s)"):format(path, i, what,
          ok and ("a JSON " .. type(rec) .. ", not an object") or tostring(rec))
      end
    end
  end
  return records, problems
end

-- ---------------------------------------------------------------------------
-- records

local function is_array(t)
  local n = #t
  if n == 0 then return next(t) == nil end
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

--- Nested maps become dotted keys ({config = {model = "xl"}} -> config.model);
-- lists stay lists.
function M.flatten(t, prefix, out)
  out = out or {}
  for k, v in pairs(t) do
    local name = prefix and (prefix .. "." .. tostring(k)) or k
    if type(v) == "table" and not is_array(v) then M.flatten(v, name, out)
    else out[name] = v end
  end
  return out
end

--- One flat result record: ember.runinfo facts (commit, device, driver, date,
-- ember, host) for `device`, then `results`, then `config`; later ones win
-- on a shared key (a script knows its device name better than runinfo does).
function M.record(config, results, device)
  local rec = require("ember.runinfo").collect(device)
  if results ~= nil and type(results) ~= "table" then
    error("ember.report.record: expected a results table, got " .. type(results), 2)
  end
  if config ~= nil and type(config) ~= "table" then
    error("ember.report.record: expected a config table, got " .. type(config), 2)
  end
  M.flatten(results or {}, nil, rec)
  M.flatten(config or {}, nil, rec)
  return rec
end

--- svg_lines(opts): see ember.svgplot.
function M.svg_lines(opts)
  return require("ember.svgplot").lines(opts)
end

return M
