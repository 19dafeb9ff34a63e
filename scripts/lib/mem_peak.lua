--- mem_peak.lua — what is alive at a recorded stretch's peak, and where it
-- was allocated: the analysis of scripts/memory_step.lua. It replays a
-- snapshot's trace (ember.memory.snapshot() with no path: Lua tables) for one
-- device, finds the event at which the live bytes peak, and groups the blocks
-- alive then by a key — by default phase / category / op of the allocation,
-- with the module path's layer numbers folded (layers.7.attn -> layers.*.attn)
-- — so "8 GiB more in the capture" reads as, e.g., "forward activation
-- swiglu 2.5 GiB". Blocks that existed before recording started appear under
-- "(before)" with the category their tag gave them (record_history tags the
-- parameters, gradients and optimizer state that exist already).
-- Load it with dofile (not a package):
--   local P = dofile(script_dir .. "lib/mem_peak.lua")
--   local a = P.analyse(ember.memory.snapshot(), {device = "cuda:0", baseline = allocated_at_start})
--   print(P.report(a, {top = 15}))
local M = {}

local fmt = string.format

--- The grouping keys analyse() knows: fields of an allocation event.
M.KEYS = {"phase", "category", "op", "module", "callsite"}

-- Layer numbers folded: every layer of a stack adds to one group.
local function fold_module(m)
  return (m or ""):gsub("%.%d+%.", ".*."):gsub("%.%d+$", ".*")
end

-- The group an allocation event belongs to under `by` (a list of M.KEYS).
local function key_of(e, by)
  local parts = {}
  for i, k in ipairs(by) do
    local v = e[k]
    if k == "module" then v = fold_module(v) end
    if v == nil or v == "" then v = "-" end
    parts[i] = v
  end
  return table.concat(parts, " ")
end

-- `by` checked: nil -> the default; a comma string or a list of M.KEYS.
-- Rows in first-seen order, one per key: returns the list and get(key), which
-- makes a key's row with new(key) the first time.
local function keyed_rows(new)
  local list, index = {}, {}
  return list, function(key)
    local r = index[key]
    if not r then
      r = new(key)
      index[key] = r
      list[#list + 1] = r
    end
    return r
  end
end

local function check_by(by)
  if by == nil then return {"phase", "category", "op"} end
  if type(by) == "string" then
    local list = {}
    for k in by:gmatch("[^,]+") do list[#list + 1] = k end
    by = list
  end
  local known = {}
  for _, k in ipairs(M.KEYS) do known[k] = true end
  if type(by) ~= "table" or #by == 0 then
    error("mem_peak.analyse: expected `by` to be a comma list of " .. table.concat(M.KEYS, ", "), 3)
  end
  for _, k in ipairs(by) do
    if not known[k] then
      error(fmt("mem_peak.analyse: unknown key '%s' in `by` (expected %s)", tostring(k), table.concat(M.KEYS, ", ")), 3)
    end
  end
  return by
end

--- Analyse a snapshot's trace for one device.
-- opts: device ("cuda:0" or "cpu"; default: the first device in the trace),
-- baseline (bytes allocated on the device when recording started, e.g.
-- ember.cuda.memory_allocated(); nil: peak is relative to the start),
-- by (grouping keys, default {"phase", "category", "op"}).
-- Returns {device, events, peak (bytes: baseline + the largest rise), rise,
-- peak_event (index in the trace, 0 when nothing was allocated), at (the
-- event that reached the peak), groups ({key, bytes, count}, largest
-- first, summing to peak when baseline is given), by}.
function M.analyse(snap, opts)
  opts = opts or {}
  if type(snap) ~= "table" or type(snap.trace) ~= "table" then
    error("mem_peak.analyse: expected a snapshot table (ember.memory.snapshot() with no path), got " .. type(snap), 2)
  end
  local by = check_by(opts.by)
  local trace = snap.trace
  local device = opts.device
  if device == nil then
    for _, e in ipairs(trace) do
      if e.action == "alloc" then device = e.device break end
    end
    device = device or "cpu"
  end
  -- pass 1: the running sum of allocations minus frees, and where it peaks
  local cur, best, best_i, n = 0, 0, 0, 0
  for i, e in ipairs(trace) do
    if e.device == device then
      n = n + 1
      if e.action == "alloc" then
        cur = cur + e.size
        if cur > best then best, best_i = cur, i end
      elseif e.action == "free" then
        cur = cur - e.size
      end
    end
  end
  -- pass 2: the blocks alive at the peak event
  local live = {}          -- addr -> allocation event (allocated during the trace)
  local before = {}        -- addr -> {size, category} of blocks from before the trace
  local freed_before = 0   -- bytes of such blocks freed before the peak
  local gone = {}          -- addresses of such blocks freed before the peak
  for i = 1, best_i do
    local e = trace[i]
    if e.device == device then
      if e.action == "alloc" then
        live[e.addr] = e
      elseif e.action == "free" then
        if live[e.addr] then live[e.addr] = nil
        else
          freed_before = freed_before + e.size
          before[e.addr] = nil
          gone[e.addr] = true
        end
      elseif e.action == "tag" then
        if live[e.addr] then
          local t = {}
          for k, v in pairs(live[e.addr]) do t[k] = v end
          t.category = e.category            -- e.g. a backward temporary that became a .grad
          live[e.addr] = t
        else
          before[e.addr] = {size = e.size, category = e.category}
        end
      end
    end
  end
  -- a block from before the trace that is tagged only after the peak was
  -- alive at it too (e.g. the cuBLASLt workspace, tagged at its next use)
  local later = {}         -- addresses allocated after the peak
  for i = best_i + 1, #trace do
    local e = trace[i]
    if e.device == device then
      if e.action == "alloc" then later[e.addr] = true
      elseif e.action == "tag" and not (live[e.addr] or later[e.addr] or gone[e.addr] or before[e.addr]) then
        before[e.addr] = {size = e.size, category = e.category}
      end
    end
  end
  local groups, group = keyed_rows(function(key) return {key = key, bytes = 0, count = 0} end)
  local function add(key, size)
    local g = group(key)
    g.bytes, g.count = g.bytes + size, g.count + 1
  end
  local tagged = 0
  for _, b in pairs(before) do
    add("(before) " .. b.category, b.size)
    tagged = tagged + b.size
  end
  if opts.baseline then
    local rest = opts.baseline - freed_before - tagged
    if rest > 0 then
      add("(before) untagged", rest)
      group("(before) untagged").count = 0      -- a sum, not blocks
    end
  end
  for _, e in pairs(live) do add(key_of(e, by), e.size) end
  table.sort(groups, function(a, b)
    if a.bytes ~= b.bytes then return a.bytes > b.bytes end
    return a.key < b.key
  end)
  return {device = device, events = n, rise = best, peak = (opts.baseline or 0) + best, baseline = opts.baseline,
          peak_event = best_i, at = trace[best_i], groups = groups, by = by}
end

-- GiB for a peak of a GiB or more, else MiB: {name, bytes}
local function unit_for(peak) return peak >= 2 ^ 30 and {"GiB", 2 ^ 30} or {"MiB", 2 ^ 20} end
local function amount(b, u) return fmt("%.3f", b / u[2]) end

--- Text report of one analysis: the peak, where it was reached, the top
-- groups alive at it.
-- opts: title, top (15), min_bytes (groups below it are summed as "the rest").
function M.report(a, opts)
  opts = opts or {}
  local top = opts.top or 15
  local u = unit_for(a.peak)
  local function n(b) return amount(b, u) end
  local out = {}
  local at = a.at
  local head = a.baseline and fmt("peak %s %s on %s (%s when recording started, +%s)", n(a.peak), u[1], a.device,
    n(a.baseline), n(a.rise)) or fmt("peak %s %s above the start on %s (no baseline: blocks from before are " ..
    "listed when tagged)", n(a.rise), u[1], a.device)
  out[#out + 1] = fmt("%s: %s, event %d of %d (%s)", opts.title or "peak", head, a.peak_event, a.events,
    at and fmt("%s %s %s %s", at.phase, at.category, at.op ~= "" and at.op or "-",
      at.module ~= "" and at.module or "-") or "at the start of recording")
  out[#out + 1] = fmt("  %-64s %10s %7s", "alive at the peak, by " .. table.concat(a.by, " / "), u[1], "blocks")
  local rest, rest_n, shown = 0, 0, 0
  for _, g in ipairs(a.groups) do
    if shown < top and g.bytes >= (opts.min_bytes or 0) then
      out[#out + 1] = fmt("  %-64s %10s %7d", g.key, n(g.bytes), g.count)
      shown = shown + 1
    else
      rest, rest_n = rest + g.bytes, rest_n + g.count
    end
  end
  if rest > 0 then out[#out + 1] = fmt("  %-64s %10s %7d", "(the rest)", n(rest), rest_n) end
  return table.concat(out, "\n")
end

--- Rows where two analyses differ most: {key, a, b, delta} sorted by |delta|.
function M.diff(a, b)
  local rows, row = keyed_rows(function(key) return {key = key, a = 0, b = 0} end)
  for _, g in ipairs(a.groups) do row(g.key).a = g.bytes end
  for _, g in ipairs(b.groups) do row(g.key).b = g.bytes end
  for _, r in ipairs(rows) do r.delta = r.b - r.a end
  table.sort(rows, function(x, y)
    if math.abs(x.delta) ~= math.abs(y.delta) then return math.abs(x.delta) > math.abs(y.delta) end
    return x.key < y.key
  end)
  return rows
end

--- Text of diff(a, b): the top rows, titled by the two names.
function M.diff_report(a, b, name_a, name_b, top)
  local u = unit_for(math.max(a.peak, b.peak))
  local function n(x) return amount(x, u) end
  local out = {fmt("where %s's peak differs from %s's (%s vs %s %s, %+.3f):", name_b, name_a, n(b.peak), n(a.peak),
    u[1], (b.peak - a.peak) / u[2])}
  out[#out + 1] = fmt("  %-64s %10s %10s %10s", "alive at the peak (" .. u[1] .. ")", name_a, name_b, "delta")
  for i, r in ipairs(M.diff(a, b)) do
    if i > (top or 15) or r.delta == 0 then break end
    out[#out + 1] = fmt("  %-64s %10s %10s %+10.3f", r.key, n(r.a), n(r.b), r.delta / u[2])
  end
  return table.concat(out, "\n")
end

return M
