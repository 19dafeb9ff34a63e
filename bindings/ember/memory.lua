--- ember.memory: memory history and snapshots (PyTorch's
-- torch.cuda.memory._record_memory_history / _dump_snapshot, for CPU and CUDA).
--
--   ember.memory.record_history(true, {max_entries = 1e6, stack_depth = 0})
--   train_step()
--   ember.memory.snapshot("step.json")      -- Ember's JSON (scripts/memviz.lua reads it)
--   ember.memory.snapshot("step.pickle")    -- python -m torch.cuda._memory_viz trace_plot step.pickle
--   ember.memory.record_history(false)
--
-- Every storage allocation and free (CPU storages; on CUDA the caching
-- allocator's blocks and segments) is recorded with its size, address,
-- device, stream, time, op, module path, phase, category and the script line
-- that caused it. docs/memory.md explains the categories and file formats.
local core = require "ember.core"
local context = require "ember.context"

local M = {}

--- The categories an allocation can have.
M.categories = {"other", "parameter", "gradient", "activation", "autograd", "optimizer_state",
  "workspace", "communication"}
local CATEGORY = {}
for _, c in ipairs(M.categories) do CATEGORY[c] = true end

-- Frames inside this package are not call sites: the user's line that
-- called into it is. (memory.lua lives beside nn.lua, optim.lua, ...)
do
  local src = debug.getinfo(1, "S").source
  local prefix = src:match("^(@.*[/\\])memory%.lua$")
  if prefix then core.mem_set_internal_prefix(prefix) end
end

local fmt = string.format

local function check_opts(fname, opts, allowed, level)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(fmt("ember.memory.%s: expected an options table or nil, got %s", fname, type(opts)), level + 1)
  end
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for n in pairs(allowed) do names[#names + 1] = n end
      table.sort(names)
      error(fmt("ember.memory.%s: unknown option '%s' (expected %s)", fname, tostring(k),
        table.concat(names, ", ")), level + 1)
    end
  end
  return opts
end

local function check_int(fname, key, v, lo, hi)
  if v == nil then return nil end
  if math.type(v) == "float" and v == math.floor(v) then v = math.tointeger(v) end
  if math.type(v) ~= "integer" or v < lo or (hi and v > hi) then
    error(fmt("ember.memory.%s: expected %s to be an integer in [%d, %s], got %s", fname, key, lo,
      hi and tostring(hi) or "inf", tostring(v)), 3)
  end
  return v
end

-- Blocks that exist before recording starts get their categories from the
-- registries nn and optim keep (weak tables): parameters, their gradients,
-- optimizer state (with AdamW's shadow weights, the bf16/f16 copies its step
-- writes). Tagging is recorded as events, so snapshots know them.
local function tag_existing()
  local nn = package.loaded["ember.nn"]
  if type(nn) == "table" and nn._live_parameters then
    for p in pairs(nn._live_parameters) do
      pcall(core.mem_tag, p, "parameter")
      pcall(core.mem_tag_grad, p, "gradient")
      pcall(core.mem_tag_shadow, p, "optimizer_state")
    end
  end
  local optim = package.loaded["ember.optim"]
  if type(optim) == "table" and optim._live_optimizers then
    for o in pairs(optim._live_optimizers) do
      for _, st in pairs(o.state or {}) do
        for _, v in pairs(st) do
          -- pcall: a state tensor may be closed (<close>) or from a dead optimizer
          if type(v) == "userdata" then pcall(core.mem_tag, v, "optimizer_state") end
        end
      end
    end
  end
end

local tracking = false   -- whether we hold ember.context's module-path tracking

--- record_history(true, opts) starts recording (a fresh history, unless
-- already recording: then only the options change); record_history(false)
-- stops, keeping what was recorded for snapshot() until clear_history() or
-- the next start. Options: max_entries (1000000; the oldest events are
-- dropped beyond it, and counted), stack_depth (0: the call site only; up to
-- 32 caller frames more), cpu (true: record CPU storages too),
-- track_modules (true: module paths on, through ember.context.track).
function M.record_history(enabled, opts)
  if type(enabled) ~= "boolean" then
    error(fmt("ember.memory.record_history: expected true or false, got %s", type(enabled)), 2)
  end
  if not enabled then
    if opts ~= nil then error("ember.memory.record_history: record_history(false) takes no options", 2) end
    core.mem_record_history(false)
    if tracking then context.track(false); tracking = false end
    return
  end
  opts = check_opts("record_history", opts,
    {max_entries = true, stack_depth = true, cpu = true, track_modules = true}, 2)
  local max_entries = check_int("record_history", "max_entries", opts.max_entries, 1)
  local depth = check_int("record_history", "stack_depth", opts.stack_depth, 0, 32)
  if opts.cpu ~= nil and type(opts.cpu) ~= "boolean" then
    error(fmt("ember.memory.record_history: expected cpu to be a boolean, got %s", type(opts.cpu)), 2)
  end
  core.mem_record_history(true, max_entries, depth, opts.cpu)
  local track = opts.track_modules ~= false
  if track and not tracking then context.track(true); tracking = true end
  if not track and tracking then context.track(false); tracking = false end
  tag_existing()
end

--- Whether history is being recorded.
function M.is_recording() return core.mem_history_stats().recording end

--- Drop the recorded events (the live-block table too, unless recording).
function M.clear_history() core.mem_clear_history() end

--- snapshot(path, opts): write segments, live blocks and the trace to path,
-- as JSON (".json") or as the pickle PyTorch's memory_viz reads (".pickle",
-- ".pkl"); opts.format = "json" | "pickle" overrides the extension. Returns
-- path. snapshot() with no path returns the JSON's content as Lua tables
-- (trace entries as tables with named fields): prefer a file for long traces.
function M.snapshot(path, opts)
  if path ~= nil and type(path) ~= "string" then
    error(fmt("ember.memory.snapshot: expected a path string or nil, got %s", type(path)), 2)
  end
  opts = check_opts("snapshot", opts, {format = true}, 2)
  if path == nil then return core.mem_snapshot() end
  local format = opts.format
  if format ~= nil and format ~= "json" and format ~= "pickle" then
    error(fmt("ember.memory.snapshot: expected format \"json\" or \"pickle\", got %s", tostring(format)), 2)
  end
  if format == nil then
    local ext = path:lower():match("%.(%w+)$")
    format = ext == "json" and "json" or (ext == "pickle" or ext == "pkl") and "pickle" or nil
    if not format then
      error(fmt("ember.memory.snapshot: cannot tell the format of \"%s\" from its extension: use .json, " ..
        ".pickle or .pkl, or {format = \"json\" | \"pickle\"}", path), 2)
    end
  end
  core.mem_snapshot_save(path, format)
  return path
end

local function check_category(fname, c)
  if not CATEGORY[c] then
    error(fmt("ember.memory.%s: expected a category (%s), got %s", fname, table.concat(M.categories, ", "),
      type(c) == "string" and ('"' .. c .. '"') or type(c)), 3)
  end
end

--- tag(t, category): t's storage now counts as `category` (e.g. a DDP
-- bucket as "communication"). Recorded as a tag event; no-op while not recording.
function M.tag(t, category)
  if not core.is_tensor(t) then
    error(fmt("ember.memory.tag: expected a tensor, got %s", type(t)), 2)
  end
  check_category("tag", category)
  core.mem_tag(t, category)
  return t
end

--- category(name, fn, ...): run fn(...) with every allocation it makes
-- counted as `name` (restored afterwards, also on error).
function M.category(name, fn, ...)
  check_category("category", name)
  if type(fn) ~= "function" then
    error(fmt("ember.memory.category: expected a function, got %s", type(fn)), 2)
  end
  local prev = core.mem_set_category_override(name)
  local res = table.pack(pcall(fn, ...))
  core.mem_set_category_override(prev)
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

--- stats(device): the allocator's statistics for a CUDA device (as
-- ember.cuda.memory_stats: allocated_bytes, reserved_bytes, peaks, counts)
-- or {device = "cpu"} (the CPU allocator keeps no counters), plus
-- `history`: recording, entries, dropped, recorded, max_entries, capacity,
-- live_blocks, live_bytes. device: "cpu", "cuda", "cuda:N" or N; default the
-- current CUDA device when there is one, else "cpu".
function M.stats(device)
  local out
  if device == "cpu" or (device == nil and not core.cuda_is_available()) then
    out = {device = "cpu"}
  else
    if device ~= nil and type(device) ~= "string" and math.type(device) ~= "integer" then
      error(fmt("ember.memory.stats: expected a device (\"cpu\", \"cuda\", \"cuda:N\" or N), got %s",
        type(device)), 2)
    end
    if not core.cuda_is_available() then
      error("ember.memory.stats: no CUDA device is available (use \"cpu\")", 2)
    end
    out = core.cuda_memory_stats(device)
    local index = math.type(device) == "integer" and device or
      (type(device) == "string" and tonumber(device:match("^cuda:(%d+)$"))) or core.cuda_current_device()
    out.device = "cuda:" .. math.tointeger(index)
  end
  out.history = core.mem_history_stats()
  return out
end

return M
