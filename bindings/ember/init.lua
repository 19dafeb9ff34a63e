--- Ember: tensors, autograd and LLaMA-style language models, from Lua.
-- `local ember = require "ember"`. The C module `ember.core` does the work;
-- this file assembles the user-facing table: every tensor method is also a
-- function `ember.NAME(t, ...)`, plus grad-mode helpers, printing and the
-- lazily loaded submodules (nn, optim, ...).
local core = require "ember.core"

local ember = {}
package.loaded["ember"] = ember       -- submodules may `require "ember"` while we load

ember.core = core
ember.__version__ = core.version
ember.version = core.version

for name, fn in pairs(core) do
  if type(fn) == "function" then ember[name] = fn end
end

local methods = core.methods
local Tensor_mt = core.Tensor_mt

--- ember.no_grad(fn, ...) / ember.enable_grad(fn, ...): run fn with autograd
-- recording switched off/on; the mode is restored when fn raises (ember.util).
local util = require "ember.util"
ember.no_grad, ember.enable_grad = util.no_grad, util.enable_grad

--- t:split(size, dim) -> list of views of at most `size` along dim (0-based dim).
function methods.split(t, size, dim)
  dim = dim or 0
  if math.type(size) ~= "integer" or size <= 0 then
    error(("ember.split: expected a positive integer split size, got %s"):format(tostring(size)), 2)
  end
  local n, out = t:size(dim), {}
  for start = 0, n - 1, size do out[#out + 1] = t:narrow(dim, start, math.min(size, n - start)) end
  return out
end

--- t:chunk(n, dim) -> n (or fewer) nearly equal views, like torch.chunk.
function methods.chunk(t, chunks, dim)
  dim = dim or 0
  if math.type(chunks) ~= "integer" or chunks <= 0 then
    error(("ember.chunk: expected a positive integer number of chunks, got %s"):format(tostring(chunks)), 2)
  end
  local n = t:size(dim)
  return methods.split(t, math.max(1, (n + chunks - 1) // chunks), dim)
end

ember.split, ember.chunk = methods.split, methods.chunk

-- ops-indexing block begin: t:index({...}) and t[idx] (ember.indexing)
require "ember.indexing"
ember.index = methods.index
-- ops-indexing block end

local printing = require "ember.printing"
Tensor_mt.__tostring = printing.tostring
ember.set_printoptions = printing.set_printoptions

ember.autograd = require "ember.autograd"

ember.cuda = require "ember.cuda"      -- devices, streams, events, memory, graphs
local amp = require "ember.amp"         -- ember.autocast, ember.backends
ember.autocast, ember.backends = amp.autocast, amp.backends

-- Submodules load on first use: `ember.nn`, `ember.optim`, `ember.profiler`, `ember.nvtx`, `ember.memory`,
-- `ember.tokenizer`, `ember.data`, `ember.checkpoint`, `ember.trainer`...
local lazy = {nn = "ember.nn", optim = "ember.optim", context = "ember.context", profiler = "ember.profiler",
              nvtx = "ember.nvtx", memory = "ember.memory", dist = "ember.dist",
              ddp = "ember.ddp", tokenizer = "ember.tokenizer", data = "ember.data",
              checkpoint = "ember.checkpoint", trainer = "ember.trainer",
              generate = "ember.generate"}

-- PyTorch's torch.cuda.memory spellings for the memory history (ember.memory,
-- which covers CPU storages too). Tail calls: errors name the caller's line.
function ember.cuda.record_memory_history(...) return require("ember.memory").record_history(...) end
function ember.cuda.memory_snapshot(...) return require("ember.memory").snapshot(...) end

--- ember.profile(fn, opts) -> profile, fn's results: run fn under the kernel
-- profiler and print its tables (ember.profiler; opts.print = false to not print).
function ember.profile(fn, opts)
  if type(fn) ~= "function" then error("ember.profile: expected a function, got " .. type(fn), 2) end
  return require("ember.profiler").profile(fn, opts)
end

--- ember.bench(fn, {warmup=5, reps=10}) -> {mean=, std=, median=, min=, max=, samples=} (seconds);
-- a callable table, so ember.bench.format(r, label) and ember.bench.stats(samples) sit beside it.
ember.bench = require "ember.bench"
setmetatable(ember, {__index = function(t, k)
  local mod = lazy[k]
  if mod then
    local m = require(mod)
    rawset(t, k, m)
    return m
  end
end})

return ember
