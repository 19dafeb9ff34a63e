--- Datasheet peaks the benchmarks divide by: the table lives in ember.peaks
-- (bindings/ember/peaks.lua), which the profiler's roofline columns use too.
-- A CPU has no entry (its bandwidth depends on the board): pass --peak-gbs /
-- --peak-tflops, or see ember.peaks.cpu() (measured).
--   local peaks = dofile("scripts/lib/device_peaks.lua")
--   local p = peaks.lookup("NVIDIA H100 80GB HBM3")  --> {gbs = 3350, tflops = {bf16 = 989.4, ...}, name = ...}
return require "ember.peaks"
