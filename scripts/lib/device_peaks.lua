--- Datasheet peaks the benchmarks divide by: memory bandwidth (GB/s) and
-- dense compute (TFLOP/s) per dtype, by device name. A CPU has no entry (its
-- bandwidth depends on the board): pass --peak-gbs / --peak-tflops.
--   local peaks = dofile("scripts/lib/device_peaks.lua")
--   local p = peaks.lookup("NVIDIA H100 80GB HBM3")  --> {gbs = 3350, tflops = {bf16 = 989.4, ...}, name = ...}
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

--- The peaks of a device name, or nil when none is known.
function M.lookup(device_name)
  for _, e in ipairs(M.TABLE) do
    if device_name and device_name:find(e.match, 1, true) then return e end
  end
  return nil
end

return M
