--- ember.peaks: what a device can do at best, for the profiler's roofline
-- columns and the benchmarks: memory bandwidth (GB/s) and dense compute
-- (TFLOP/s) per FLOP class (f32, f64, tf32, bf16, f16).
--
--   local peaks = require "ember.peaks"
--   peaks.lookup("NVIDIA H100 80GB HBM3")  --> {gbs = 3350, tflops = {bf16 = 989.4, ...}, name = "H100 SXM", ...}
--   peaks.current()                        --> the current CUDA device's datasheet entry, else the CPU's measured peaks
--   peaks.cpu()                            --> measured once per process: a STREAM-like copy and an f32 matmul
--
-- GPU figures are datasheet peaks (dense, no sparsity); the CPU's are
-- measured (a CPU's bandwidth depends on the board), so a CPU "% of peak" is
-- against what this machine reached in the same process, not a datasheet.
local core = require "ember.core"

local M = {}

-- SXM parts (the ones the GPU host lends); f32 is plain FMA (no tensor cores),
-- tf32 the tensor-core figure ember.backends.tf32 enables.
M.TABLE = {
  {match = "H200", name = "H200 SXM", gbs = 4800,
   tflops = {bf16 = 989.4, f16 = 989.4, tf32 = 494.7, f32 = 66.9, f64 = 66.9}},
  {match = "H100", name = "H100 SXM", gbs = 3350,
   tflops = {bf16 = 989.4, f16 = 989.4, tf32 = 494.7, f32 = 66.9, f64 = 66.9}},
  {match = "A100", name = "A100 SXM 80GB", gbs = 2039,
   tflops = {bf16 = 312, f16 = 312, tf32 = 156, f32 = 19.5, f64 = 19.5}},
}

M.CLASSES = {"f32", "f64", "tf32", "bf16", "f16"}

--- The datasheet peaks of a device name, or nil when none is known.
function M.lookup(device_name)
  for _, e in ipairs(M.TABLE) do
    if device_name and device_name:find(e.match, 1, true) then
      return {match = e.match, name = e.name, gbs = e.gbs, tflops = e.tflops, source = "datasheet"}
    end
  end
  return nil
end

local cpu_cache

-- Best of `reps` timings of fn (seconds).
local function best_time(fn, reps)
  fn()
  local best = math.huge
  for _ = 1, reps do
    local t0 = core.clock()
    fn()
    best = math.min(best, core.clock() - t0)
  end
  return best
end

--- The CPU's peaks, measured once per process (~0.2 s): a copy of 32 MiB of
-- f32 (read + write counted, as STREAM's copy) and a 512³ f32 matmul. Every
-- FLOP class gets the f32 matmul's rate (CPU BLAS has no tensor cores).
-- Must not run inside a profiling session (its ops would be recorded).
function M.cpu()
  if cpu_cache then return cpu_cache end
  if core.prof_running() then
    error("ember.peaks.cpu: cannot measure while a profile is running (measure before start, or pass peaks)", 2)
  end
  local ember = require "ember"
  local n = 8 * 1024 * 1024
  local a, b = ember.ones(n), ember.empty(n)
  local copy_s = best_time(function() b:copy_(a) end, 5)
  local m = 512
  local x, y = ember.ones(m, m), ember.ones(m, m)   -- not randn: measuring must not move the RNG
  local mm_s = best_time(function() local _ = x:matmul(y) end, 5)
  local tf = 2 * m * m * m / mm_s / 1e12
  cpu_cache = {name = "CPU (measured)", source = "measured", gbs = 2 * n * 4 / copy_s / 1e9,
               tflops = {f32 = tf, f64 = tf, tf32 = tf, bf16 = tf, f16 = tf}}
  return cpu_cache
end

--- The peaks of the current CUDA device (datasheet; nil for an unknown GPU),
-- or of the CPU (measured) when there is no GPU.
function M.current()
  if core.cuda_is_available() then
    local ok, name = pcall(core.cuda_device_name)
    return ok and M.lookup(name) or nil
  end
  return M.cpu()
end

--- Peaks from numbers: gbs and one TFLOP/s figure (or a per-class table) —
-- what --peak-gbs / --peak-tflops give.
function M.make(gbs, tflops, name)
  local t = type(tflops) == "table" and tflops or {}
  if type(tflops) == "number" then for _, c in ipairs(M.CLASSES) do t[c] = tflops end end
  return {name = name or "given", source = "given", gbs = gbs, tflops = t}
end

--- "3350 GB/s, bf16 989.4 / tf32 494.7 / f32 66.9 TF/s (H100 SXM, datasheet)"
function M.describe(p)
  if not p then return "no peaks known" end
  local tf, parts, same = p.tflops or {}, {}, true
  for _, c in ipairs(M.CLASSES) do same = same and tf[c] == tf.f32 end
  for _, c in ipairs(same and {"f32"} or {"bf16", "tf32", "f32"}) do
    if tf[c] then parts[#parts + 1] = (same and "%.4g" or c .. " %.4g"):format(tf[c]) end
  end
  return ("%s GB/s, %s TF/s (%s, %s)"):format(p.gbs and ("%.4g"):format(p.gbs) or "?",
    #parts > 0 and table.concat(parts, " / ") or "?", p.name or "?", p.source or "?")
end

return M
