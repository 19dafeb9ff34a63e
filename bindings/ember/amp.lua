--- Mixed precision and backend switches: ember.autocast(dtype, fn) and
-- ember.backends.
--
--     ember.autocast("bf16", function()
--       local loss = F.cross_entropy(model(x), y)   -- matmuls in bf16, loss in f32
--       loss:backward()                            -- grads land in f32 (master weights)
--     end)
--
-- While a region is open, matmul/linear/attention cast their floating inputs
-- to the region's dtype and accumulate in f32; norms, softmax, log_softmax,
-- cross-entropy and reductions compute in f32 and return f32 (see
-- engine/include/ember/autocast.h). Parameters and optimizer state stay f32.
-- Regions nest (same dtype), and the state is restored when fn raises.
local core = require "ember.core"
local M = {backends = {}}

local is_callable = require("ember.util").is_callable

--- Run fn(...) and return its results; `close()` runs afterwards whether fn
-- returned or raised (the error is re-raised unchanged).
local function run_then(close, fn, ...)
  local res = table.pack(pcall(fn, ...))
  close()
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

--- Leave every open region; returns (depth, dtype) to re-open them later.
local function leave_all()
  local depth, dtype = 0, core.autocast_dtype()
  while core.autocast_enabled() do
    core.autocast_exit()
    depth = depth + 1
  end
  return depth, dtype
end

--- ember.autocast(dtype, fn, ...) -> fn(...)'s results, computed with autocast on.
-- dtype: "bf16" or "f16" (torch names bfloat16/float16 work too). An inner
-- region must use the outer one's dtype. `ember.autocast(false, fn)` runs fn
-- with autocast off inside an enclosing region (torch's enabled=False), and
-- re-opens the enclosing regions afterwards.
function M.autocast(dtype, fn, ...)
  if not is_callable(fn) then
    error("ember.autocast: expected argument 2 (fn) to be a function, got " .. type(fn), 2)
  end
  if dtype == false then
    local depth, outer = leave_all()
    return run_then(function()
      for _ = 1, depth do core.autocast_enter(outer) end
    end, fn, ...)
  end
  if type(dtype) ~= "string" then
    error("ember.autocast: expected argument 1 (dtype) to be \"bf16\", \"f16\" or false, got " ..
      tostring(dtype), 2)
  end
  core.autocast_enter(dtype)          -- raises (before fn runs) on a bad or mismatched dtype
  return run_then(core.autocast_exit, fn, ...)
end

--- True inside an autocast region.
function M.is_autocast_enabled() return core.autocast_enabled() end

--- The open region's dtype ("bf16"/"f16"), or nil outside a region.
function M.get_autocast_dtype() return core.autocast_dtype() end

--- ember.backends.tf32(on) -> previous setting. Allows TF32 tensor cores for
-- f32 matmuls on CUDA (off by default: f32 results then match the CPU to
-- ~1e-5; with TF32 on, to ~1e-3). ember.backends.tf32() only reads it.
-- Builds without CUDA keep the flag but have nothing to apply it to.
function M.backends.tf32(on)
  if on == nil then return core.cuda_allow_tf32() end
  if type(on) ~= "boolean" then
    error("ember.backends.tf32: expected argument 1 (on) to be a boolean, got " .. type(on), 2)
  end
  return core.cuda_set_allow_tf32(on)
end

--- ember.backends.matmul_tune(on) -> previous setting. With it on, the first
-- CUDA matmul of each new key (shape, transposes, dtypes, leading dims,
-- alignments, bias epilogue, beta) times up to 16 of cuBLASLt's candidate
-- algorithms and up to 24 split-K / cluster / tile configurations beyond its
-- list (a host sync, once per key; never during ember.cuda.graph
-- capture, where the heuristic's first choice runs) and later calls use the
-- fastest. Off by default: a timed choice can differ between processes and
-- change the last bits of results; off gives the heuristic's bits. The start
-- value comes from EMBER_MATMUL_TUNE=0|1. ember.backends.matmul_tune() only
-- reads it; ember.core.matmul_tune_table() lists the choices (docs/perf.md).
function M.backends.matmul_tune(on)
  if on == nil then return core.matmul_tune() end
  if type(on) ~= "boolean" then
    error("ember.backends.matmul_tune: expected argument 1 (on) to be a boolean, got " .. type(on), 2)
  end
  return core.matmul_set_tune(on)
end

return M
