--- ember.context: which module and phase the engine is working for, so the
-- profiler, NVTX ranges and memory history can attribute kernels and
-- allocations ("layers.3.attn", "backward"). Tracking costs nothing while
-- off; measurement tools switch it on with context.track(true) and off with
-- context.track(false) (counted: two tools may hold it at once).
--
--   context.phase("optimizer", fn, ...)   run fn with the phase set
--   context.module_path()                  "layers.3.attn" ("" at the root)
--
-- Backward needs no marking: em_backward sets the phase, and every autograd
-- node remembers the module whose forward created it.
local core = require "ember.core"
local M = {enabled = false}

local holders = 0

--- Switch module-path tracking on (true) or off (false); returns whether it is on.
function M.track(on)
  if on then holders = holders + 1 elseif holders > 0 then holders = holders - 1 end
  M.enabled = holders > 0
  return M.enabled
end

function M.module_path() return core.ctx_module() end
function M.current_phase() return core.ctx_phase() end

local function restore_phase(prev)
  return setmetatable({}, {__close = function() core.ctx_set_phase(prev) end})
end

--- Run fn(...) with the phase set to `name` ("forward", "backward",
-- "optimizer", "none"), restored afterwards even on error.
function M.phase(name, fn, ...)
  local prev = core.ctx_set_phase(name)
  local _ <close> = restore_phase(prev)
  return fn(...)
end

-- Interned path handles per (parent handle, child name), so a call costs a
-- few table lookups, not string concatenations.
local handles = {}
local root = core.ctx_intern("")
local path_of = {[root] = ""}

local function child_handle(parent, name)
  local per_parent = handles[parent]
  if not per_parent then per_parent = {} handles[parent] = per_parent end
  local h = per_parent[name]
  if not h then
    local pp = path_of[parent]
    local path = pp == "" and name or (pp .. "." .. name)
    h = core.ctx_intern(path)
    path_of[h] = path
    per_parent[name] = h
  end
  return h
end

--- The path handle of a module, from the registration tree (PyTorch's
-- named_modules names: "layers.3.attn") whoever calls it. A module nobody
-- registered is the root ("").
local function handle_of(module, depth)
  local parent = rawget(module, "_ember_parent")
  if parent == nil or depth > 64 then return root end
  return child_handle(handle_of(parent, depth + 1), rawget(module, "_ember_name"))
end

--- The path string of a module ("" for a top-level one).
function M.path_of(module) return path_of[handle_of(module, 0)] end

local function restore_module(prev, prev_phase)
  return setmetatable({}, {__close = function()
    core.ctx_set_module(prev)
    if prev_phase then core.ctx_set_phase(prev_phase) end
  end})
end

--- Call method(module, ...) inside the module's path (a forward variant
-- such as TransformerBlock.forward_residual). A call outside any phase is
-- marked "forward".
function M.call_method(module, method, ...)
  local prev = core.ctx_set_module(handle_of(module, 0))
  local prev_phase = core.ctx_phase() == "none" and core.ctx_set_phase("forward") or nil
  local _ <close> = restore_module(prev, prev_phase)
  return method(module, ...)
end

--- Call module:forward(...) inside its module path (nn.Module's __call uses
-- this while tracking is on).
function M.call_module(module, ...)
  return M.call_method(module, module.forward, ...)
end

return M
