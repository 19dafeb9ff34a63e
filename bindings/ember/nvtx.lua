--- ember.nvtx: NVTX ranges for Nsight Systems (torch.cuda.nvtx's shape).
--
--   ember.nvtx.range("step 3", fn, ...)   run fn(...) inside a range (popped on error too)
--   ember.nvtx.push("name") / ember.nvtx.pop()
--   ember.nvtx.mark("name")               an instant marker
--   ember.nvtx.enable(true)               a range per op: "matmul [layers.3.attn]"
--
-- User ranges and the phase ranges (forward / backward / optimizer, emitted
-- on every phase change) are always on; per-op ranges only after
-- enable(true), which also turns module-path tracking on (ember.context).
-- `nsys profile -t cuda,nvtx ember run script.lua` shows them all. In builds
-- without CUDA everything is a no-op and available() is false; a running
-- ember.profiler still records user ranges and marks.
local core = require "ember.core"
local context = require "ember.context"

local M = {}
local tracking = false

--- True when this build emits NVTX (CUDA builds).
function M.available() return core.nvtx_available() end

--- Per-op ranges on (true) or off (false); returns whether they are on
-- (always false without NVTX).
function M.enable(on)
  local now = core.nvtx_enable(on and true or false)
  if now ~= tracking then
    context.track(now)
    tracking = now
  end
  return now
end

function M.enabled() return core.nvtx_enabled() end

local function check_name(fn, name)
  if type(name) ~= "string" then
    error(("ember.nvtx.%s: expected argument 1 (name) to be a string, got %s"):format(fn, type(name)), 3)
  end
end

function M.push(name) check_name("push", name) core.nvtx_push(name) end
function M.pop() core.nvtx_pop() end
function M.mark(name) check_name("mark", name) core.nvtx_mark(name) end

local popper = setmetatable({}, {__close = function() core.nvtx_pop() end})

--- Run fn(...) inside the range `name`; returns fn's results.
function M.range(name, fn, ...)
  check_name("range", name)
  if type(fn) ~= "function" then
    error(("ember.nvtx.range: expected argument 2 (fn) to be a function, got %s"):format(type(fn)), 2)
  end
  core.nvtx_push(name)
  local _ <close> = popper
  return fn(...)
end

return M
