--- ember.sweep: campaigns — a grid of configurations of one script, each run
-- in its own process (bindings/ember/sweep_run.lua), results appended to a
-- JSON-lines file so an interrupted campaign resumes where it stopped.
-- This file reads and checks a campaign and expands it into points; the
-- command is bindings/ember/sweep_cli.lua, the format docs/sweeps.md.
--
--   local sweep = require "ember.sweep"
--   local c = sweep.load("scripts/campaigns/model_sizes.lua")
--   for _, p in ipairs(sweep.points(c)) do print(p.label, table.concat(p.args, " ")) end
local M = {}

-- Every key a campaign may have, with what it expects (the error names it).
local KEYS = {
  name = "a string (default: the file's name)",
  description = "a string",
  script = "the path of the script to run (a string)",
  args = "a list of fixed arguments (strings or numbers)",
  axes = "a list of axes {name=, flag=, values={...}}",
  skip = "a function(point) returning true or a reason to skip the point",
  timeout = "seconds per point (a number > 0, or false for none)",
  json_flag = "the script's option that names its JSON output file (a string)",
  device = "the device runinfo describes: \"cpu\", \"cuda\" or \"cuda:N\"",
  env = "a table of environment variables for every point",
  table = "a table {columns = {...}}",
  plots = "a list of plot specs {x=, y=, series=, ...}",
}
local AXIS_KEYS = {name = true, flag = true, values = true}
local TABLE_KEYS = {columns = true}
local PLOT_KEYS = {x = true, y = true, series = true, facet = true, xlog = true, ylog = true,
  title = true, xlabel = true, ylabel = true, file = true, where = true, rows = true,
  width = true, height = true, share = true, panels_per_row = true}

M.DEFAULT_TIMEOUT = 3600

local sorted_keys = require("ember.util").sorted_keys

local function describe(v)
  local t = type(v)
  if t == "string" then return ("the string %q"):format(v) end
  if t == "table" then return #v > 0 and ("a list of %d"):format(#v) or "a table" end
  if t == "nil" then return "nothing" end
  return ("%s %s"):format(t, tostring(v))
end

--- A value as an argument and a label: 128 not 128.0, true as "true".
function M.value_string(v)
  if math.type(v) == "float" and v == math.floor(v) and math.abs(v) < 1e15 then
    return ("%d"):format(v)
  end
  return tostring(v)
end

local function is_list(t)
  if type(t) ~= "table" then return false end
  local n = #t
  for k in pairs(t) do
    if math.type(k) ~= "integer" or k < 1 or k > n then return false end
  end
  return true
end

-- ---------------------------------------------------------------------------
-- checking

local function checker(source)
  return function(cond, where, expected, got)
    if not cond then
      error(("%s: %s: expected %s, got %s"):format(source, where, expected, describe(got)), 0)
    end
  end
end

local function check_unknown(t, known, source, where)
  for _, k in ipairs(sorted_keys(t)) do
    if not known[k] then
      local names = sorted_keys(known)
      error(("%s: %s: unknown key '%s' (expected one of: %s)"):format(source, where, tostring(k),
        table.concat(names, ", ")), 0)
    end
  end
end

local function check_axis(a, i, source, need)
  local where = ("axes[%d]"):format(i)
  need(type(a) == "table", where, "a table {name=, flag=, values={...}}", a)
  check_unknown(a, AXIS_KEYS, source, where)
  need(type(a.name) == "string" and a.name:match("^[%a_][%w_%.]*$"), where .. ".name",
    "a name made of letters, digits and _ (it is a column and a --filter key)", a.name)
  where = ("axes[%d] (%s)"):format(i, a.name)
  need(a.flag == nil or a.flag == false or type(a.flag) == "string", where .. ".flag",
    "an option string such as \"--" .. a.name .. "\" (or false: the value alone)", a.flag)
  need(is_list(a.values) and #a.values > 0, where .. ".values", "a non-empty list of values", a.values)
  local seen = {}
  for j, v in ipairs(a.values) do
    local t = type(v)
    need(t == "string" or t == "number" or t == "boolean", ("%s.values[%d]"):format(where, j),
      "a string, number or boolean", v)
    local s = M.value_string(v)
    need(not seen[s], ("%s.values[%d]"):format(where, j), "distinct values", v)
    seen[s] = true
  end
end

local function check_columns(cols, source, need, where)
  need(is_list(cols), where, "a list of columns (keys, or {key=, title=, fmt=, value=})", cols)
  for j, c in ipairs(cols) do
    local w = ("%s[%d]"):format(where, j)
    need(type(c) == "string" or (type(c) == "table" and (type(c.key) == "string" or
      type(c.value) == "function")), w, "a key, or a table with key= or value=", c)
  end
end

local function check_plot(p, i, source, need)
  local where = ("plots[%d]"):format(i)
  need(type(p) == "table", where, "a table {x=, y=, series=, ...}", p)
  check_unknown(p, PLOT_KEYS, source, where)
  for _, k in ipairs({"x", "y"}) do
    need(type(p[k]) == "string" or type(p[k]) == "function", where .. "." .. k,
      "a field name or a function(row)", p[k])
  end
  for _, k in ipairs({"series", "title", "xlabel", "ylabel", "file"}) do
    need(p[k] == nil or type(p[k]) == "string", where .. "." .. k, "a string", p[k])
  end
  need(p.facet == nil or type(p.facet) == "string" or is_list(p.facet), where .. ".facet",
    "a field name or a list of them", p.facet)
  need(p.where == nil or type(p.where) == "function" or type(p.where) == "table", where .. ".where",
    "a function(row) or a table of field = value", p.where)
  need(p.rows == nil or type(p.rows) == "function", where .. ".rows",
    "a function(records) returning the rows to plot", p.rows)
end

--- Checks a campaign table and fills in defaults. `source` names it in
-- errors ("campaign.lua: axes[2].values: expected ..., got ...").
function M.validate(c, source, path)
  source = source or "campaign"
  local need = checker(source)
  need(type(c) == "table", "the file", "to return a campaign table", c)
  check_unknown(c, KEYS, source, "campaign")
  need(type(c.script) == "string" and c.script ~= "", "script", KEYS.script, c.script)
  local default_name = path and path:match("([^/]+)%.lua$") or "campaign"
  c.name = c.name or default_name
  need(type(c.name) == "string" and c.name:match("^[%w_%.%-]+$"), "name",
    "a string of letters, digits, _ . - (it names the output folder)", c.name)
  need(c.description == nil or type(c.description) == "string", "description", KEYS.description, c.description)
  c.args = c.args or {}
  need(is_list(c.args), "args", KEYS.args, c.args)
  for i, a in ipairs(c.args) do
    need(type(a) == "string" or type(a) == "number", ("args[%d]"):format(i), "a string or number", a)
  end
  need(is_list(c.axes) and #c.axes > 0, "axes", "a non-empty list of axes {name=, flag=, values={...}}", c.axes)
  local names = {}
  for i, a in ipairs(c.axes) do
    check_axis(a, i, source, need)
    need(not names[a.name], ("axes[%d].name"):format(i), "a name no other axis has", a.name)
    names[a.name] = true
  end
  need(c.skip == nil or type(c.skip) == "function", "skip", KEYS.skip, c.skip)
  if c.timeout == nil then c.timeout = M.DEFAULT_TIMEOUT end
  need(c.timeout == false or (type(c.timeout) == "number" and c.timeout > 0), "timeout", KEYS.timeout, c.timeout)
  c.json_flag = c.json_flag or "--json"
  need(type(c.json_flag) == "string" and c.json_flag ~= "", "json_flag", KEYS.json_flag, c.json_flag)
  need(c.device == nil or type(c.device) == "string", "device", KEYS.device, c.device)
  c.env = c.env or {}
  need(type(c.env) == "table", "env", KEYS.env, c.env)
  for k, v in pairs(c.env) do
    need(type(k) == "string" and k:match("^[%a_][%w_]*$") and (type(v) == "string" or type(v) == "number"),
      "env", "NAME = \"value\" pairs", k)
  end
  c.table = c.table or {}
  need(type(c.table) == "table", "table", KEYS.table, c.table)
  check_unknown(c.table, TABLE_KEYS, source, "table")
  if c.table.columns == nil then
    local cols = {}
    for i, a in ipairs(c.axes) do cols[i] = a.name end
    cols[#cols + 1] = "status"
    cols[#cols + 1] = {key = "wall_s", title = "wall s", fmt = "%.1f"}
    c.table.columns = cols
  end
  check_columns(c.table.columns, source, need, "table.columns")
  c.plots = c.plots or {}
  need(is_list(c.plots), "plots", KEYS.plots, c.plots)
  for i, p in ipairs(c.plots) do check_plot(p, i, source, need) end
  c.source = path
  return c
end

--- Loads and checks a campaign file. Errors read "FILE: what: expected ..., got ...".
function M.load(path)
  local chunk, err = loadfile(path, "t", setmetatable({}, {__index = _G}))
  if not chunk then error("cannot load the campaign: " .. tostring(err), 0) end
  local ok, c = pcall(chunk)
  if not ok then error(path .. ": error while running the campaign file: " .. tostring(c), 0) end
  return M.validate(c, path, path)
end

-- ---------------------------------------------------------------------------
-- points

--- The arguments one axis value adds: "--flag value"; a boolean is the flag
-- alone (true) or nothing (false); flag = false passes the value alone.
local function axis_args(a, v)
  local flag = a.flag
  if flag == nil then flag = "--" .. a.name:gsub("_", "-") end
  if type(v) == "boolean" then
    if flag == false then return {tostring(v)} end
    return v and {flag} or {}
  end
  if flag == false then return {M.value_string(v)} end
  return {flag, M.value_string(v)}
end

--- Identity of a point for resume: the script and its full argument list, so
-- changing a fixed argument (more --steps) makes new points, not stale hits.
function M.key(script, args)
  return script .. "\0" .. table.concat(args, "\0")
end

--- A point's name in logs and progress lines: "model=xl context=512".
function M.label(values, axes)
  local parts = {}
  for i, a in ipairs(axes) do parts[i] = a.name .. "=" .. M.value_string(values[a.name]) end
  return table.concat(parts, " ")
end

--- Every point of the grid, the first axis varying slowest:
-- {index=, values={axis=value}, label=, args={...}, key=, skip=reason|nil}.
function M.points(c)
  local out = {}
  local values = {}
  local function rec(i)
    if i > #c.axes then
      local args = {}
      for _, a in ipairs(c.args) do args[#args + 1] = M.value_string(a) end
      for _, a in ipairs(c.axes) do
        for _, s in ipairs(axis_args(a, values[a.name])) do args[#args + 1] = s end
      end
      local p = {index = #out + 1, values = {}, args = args}
      for k, v in pairs(values) do p.values[k] = v end
      p.label = M.label(p.values, c.axes)
      p.key = M.key(c.script, args)
      if c.skip then
        local copy = {}
        for k, v in pairs(p.values) do copy[k] = v end
        local ok, why = pcall(c.skip, copy)
        if not ok then error(("%s: skip(%s) raised: %s"):format(c.source or "campaign", p.label, why), 0) end
        if why then p.skip = type(why) == "string" and why or "skip() said so" end
      end
      out[#out + 1] = p
      return
    end
    for _, v in ipairs(c.axes[i].values) do
      values[c.axes[i].name] = v
      rec(i + 1)
    end
  end
  rec(1)
  return out
end

-- ---------------------------------------------------------------------------
-- --filter model=xl,2.7b

--- Parses "axis=v1,v2" against the campaign's axes: {axis=, set={value=true}}.
function M.parse_filter(c, spec)
  local name, list = tostring(spec):match("^([^=]+)=(.*)$")
  if not name or list == "" then
    error(("--filter %s: expected AXIS=VALUE[,VALUE...]"):format(spec), 0)
  end
  local axis
  for _, a in ipairs(c.axes) do if a.name == name then axis = a end end
  if not axis then
    local names = {}
    for i, a in ipairs(c.axes) do names[i] = a.name end
    error(("--filter %s: no axis '%s' (axes: %s)"):format(spec, name, table.concat(names, ", ")), 0)
  end
  local known, set = {}, {}
  for _, v in ipairs(axis.values) do known[M.value_string(v)] = true end
  for v in (list .. ","):gmatch("([^,]*),") do
    if not known[v] then
      local vs = {}
      for i, x in ipairs(axis.values) do vs[i] = M.value_string(x) end
      error(("--filter %s: '%s' is not a value of axis %s (values: %s)"):format(spec, v, name,
        table.concat(vs, ", ")), 0)
    end
    set[v] = true
  end
  return {axis = name, set = set}
end

function M.matches(point, filters)
  for _, f in ipairs(filters or {}) do
    if not f.set[M.value_string(point.values[f.axis])] then return false end
  end
  return true
end

-- ---------------------------------------------------------------------------
-- results already on disk

M.DONE = {ok = true, OOM = true}

--- For each point key, the records of its latest run (a run's records share
-- a run_id; the file is append-only, so the last run_id seen is the latest).
function M.latest(records)
  local last = {}
  for _, r in ipairs(records) do
    if type(r.script) == "string" and is_list(r.args) then
      local k = M.key(r.script, r.args)
      if not last[k] or last[k].run_id ~= r.run_id then last[k] = {run_id = r.run_id, records = {}} end
      table.insert(last[k].records, r)
    end
  end
  local out = {}
  for k, v in pairs(last) do out[k] = v.records end
  return out
end

--- "done" (every record ok or OOM), "failed" or nil (never ran).
function M.state(latest_records)
  if not latest_records then return nil end
  for _, r in ipairs(latest_records) do
    if not M.DONE[r.status] then return "failed", r.status end
  end
  return "done", latest_records[1].status
end

return M
