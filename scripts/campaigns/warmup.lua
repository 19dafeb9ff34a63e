--- What the first steps cost: bench_model --model small with 0, 1, 2 or 5
-- untimed warm-up steps before 5 timed ones. With --warmup 0 the first timed
-- step pays for kernel/cuBLASLt set-up and the caching allocator growing;
-- the per-step plot shows how many steps that takes to wear off.
--
--   ember sweep scripts/campaigns/warmup.lua        (16 points, sweeps/warmup/)
--
-- bench_model writes every step's time in its JSON line (samples_ms); the
-- table and plots read the first steps from there.
local function step(i)
  return function(r) return type(r.samples_ms) == "table" and r.samples_ms[i] or nil end
end

return {
  name = "warmup",
  description = "bench_model.lua --model small: the first timed steps after 0, 1, 2, 5 warm-up steps.",
  script = "scripts/bench_model.lua",
  args = {"--model", "small", "--device", "cuda", "--context", "512", "--batch", "4", "--steps", "5"},
  device = "cuda",
  axes = {
    {name = "mode", values = {"fwd", "train"}},
    {name = "precision", values = {"fp32", "bf16"}},
    {name = "warmup", values = {0, 1, 2, 5}},
  },
  timeout = 300,
  table = {columns = {
    "mode", "precision", "warmup",
    {key = "step1_ms", title = "step 1 ms", fmt = "%.2f", value = step(1)},
    {key = "step2_ms", title = "step 2 ms", fmt = "%.2f", value = step(2)},
    {key = "median_ms", title = "median ms", fmt = "%.2f"},
    {key = "first_over_median", title = "step 1 / median", fmt = "%.2f",
     value = function(r)
       local first = step(1)(r)
       return first and type(r.median_ms) == "number" and first / r.median_ms or nil
     end},
    "status",
  }},
  plots = {
    -- one row per timed step: the records' samples_ms spread out
    {x = "step", y = "ms", series = "warmup", facet = {"mode", "precision"}, ylog = true,
     title = "ms of each timed step, by number of warm-up steps", xlabel = "timed step",
     ylabel = "ms", file = "steps.svg",
     rows = function(records)
       local rows = {}
       for _, r in ipairs(records) do
         for i, ms in ipairs(type(r.samples_ms) == "table" and r.samples_ms or {}) do
           rows[#rows + 1] = {mode = r.mode, precision = r.precision, warmup = r.warmup, step = i,
                              ms = ms, status = r.status}
         end
       end
       return rows
     end},
    {x = "warmup", y = step(1), series = "mode", facet = "precision", ylog = true,
     title = "first timed step vs warm-up steps", ylabel = "step 1 ms", file = "first_step.svg"},
  },
}
