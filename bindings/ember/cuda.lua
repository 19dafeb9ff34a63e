--- ember.cuda: devices, memory statistics, streams, events and CUDA graphs
-- (PyTorch's torch.cuda names). Without a GPU the queries (is_available,
-- device_count, is_compiled) answer and everything else raises
-- "ember.cuda.NAME: no CUDA device is available".
--
--   local s = ember.cuda.Stream()
--   ember.cuda.stream(s, function() ... end)          -- ops launch on s
--   local t0, t1 = ember.cuda.Event{enable_timing=true}, ember.cuda.Event{enable_timing=true}
--   t0:record(); work(); t1:record(); t1:synchronize(); print(t0:elapsed_time(t1), "ms")
--   local g, loss = ember.cuda.graph(step, {warmup=2})  -- capture step(); loss is a static output
--   x:copy_(next_batch); g:replay()                     -- loss now holds the new value
local core = require "ember.core"

local cuda = {
  is_available = core.cuda_is_available,
  device_count = core.cuda_device_count,
  is_compiled = core.cuda_compiled,
}

local function need(name)
  if not core.cuda_is_available() then
    error(("ember.cuda.%s: no CUDA device is available%s"):format(name,
      core.cuda_compiled() and "" or " (this build has no CUDA backend)"), 3)
  end
end

-- Wrap a core function so that it raises the "no CUDA device" error first.
local function wrap(name, fn)
  return function(...)
    need(name)
    return fn(...)
  end
end

for name, fn in pairs {
  set_device = core.cuda_set_device, current_device = core.cuda_current_device,
  device_name = core.cuda_device_name, get_device_name = core.cuda_device_name,
  synchronize = core.cuda_synchronize, memory_stats = core.cuda_memory_stats,
  reset_peak_memory_stats = core.cuda_reset_peak_memory_stats, empty_cache = core.cuda_empty_cache,
  Stream = core.cuda_Stream, current_stream = core.cuda_current_stream, Event = core.cuda_Event,
} do
  cuda[name] = wrap(name, fn)
end

local function stat(name, key)
  cuda[name] = wrap(name, function(device) return core.cuda_memory_stats(device)[key] end)
end
stat("memory_allocated", "allocated_bytes")
stat("max_memory_allocated", "peak_allocated_bytes")
stat("memory_reserved", "reserved_bytes")
stat("max_memory_reserved", "peak_reserved_bytes")

--- ember.cuda.stream(s, fn, ...): run fn with s as the current stream (restored after, also on error).
cuda.stream = wrap("stream", function(s, fn, ...)
  local prev = core.cuda_current_stream()
  core.cuda_set_stream(s)
  local res = table.pack(pcall(fn, ...))
  core.cuda_set_stream(prev)
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end)

--- ember.cuda.graph(fn, {warmup=1, device=}) -> graph, fn's results.
-- Runs fn `warmup` times eagerly (lazily created state, such as optimizer
-- moments, must exist before capture), then captures one call of fn into a
-- CUDA graph. Tensors fn creates during capture live in the graph's private
-- memory and are rewritten by every g:replay() (return them: static
-- outputs); tensors fn reads must be updated in place (x:copy_(new)) before
-- a replay (static inputs). Host synchronisation inside fn (item, cpu,
-- printing, synchronize) raises an error naming the op and the Lua line, and
-- the capture is discarded. Random ops (rand, randn, dropout, ...) draw fresh
-- numbers at every replay: they read their Philox counter from the graph's
-- device cell, which each replay sets from the global generator.
-- g:replay() launches on the current stream; g:close() frees the graph and,
-- once its outputs are garbage, its memory. Module paths are tracked during
-- the capture, so profiles of replays name each kernel's module.
cuda.graph = wrap("graph", function(fn, opts)
  if type(fn) ~= "function" then
    error(("ember.cuda.graph: expected argument 1 to be a function, got %s"):format(type(fn)), 2)
  end
  opts = opts or {}
  local warmup = opts.warmup or 1
  if math.type(warmup) ~= "integer" or warmup < 0 then
    error(("ember.cuda.graph: expected warmup to be an integer >= 0, got %s"):format(tostring(opts.warmup)), 2)
  end
  for _ = 1, warmup do fn() end
  core.cuda_synchronize(opts.device)
  -- collect warm-up garbage now; the automatic collector stays off during
  -- the capture. Explicit collections still run in it: the one as each
  -- backward starts (lua_tensor.c: the forward's dead handles, whose
  -- activations would otherwise live through backward and size the graph's
  -- pool) and the device-memory ones; finalizers are safe there (frees are
  -- host bookkeeping, driver frees are deferred to the capture's end)
  collectgarbage("collect")
  local gc_running = collectgarbage("isrunning")
  collectgarbage("stop")
  local ok, err = pcall(core.cuda_graph_begin, opts.device)
  if not ok then
    if gc_running then collectgarbage("restart") end
    error(err, 0)
  end
  -- module paths on while capturing (a capture-time cost only): a profiler
  -- started later attributes the replayed kernels to their modules
  local context = require "ember.context"
  context.track(true)
  local res = table.pack(pcall(fn))
  context.track(false)
  if not res[1] then
    core.cuda_graph_abort()
    if gc_running then collectgarbage("restart") end
    error(res[2], 0)
  end
  local g
  ok, g = pcall(core.cuda_graph_end, fn)
  if gc_running then collectgarbage("restart") end
  if not ok then error(g, 0) end
  return g, table.unpack(res, 2, res.n)
end)

return cuda
