--- DDP bucket sweep on 2 GPUs: bucketed DDP's step time, exposed
-- communication and the planner's prediction by bucket size (1 … 1000 MiB),
-- Ember beside PyTorch's DDP(bucket_cap_mb) for small and xl, bf16, B4 T512.
--
--   ember sweep scripts/campaigns/ddp_buckets.lua            (10 points, sweeps/ddp_buckets/)
--   ember sweep scripts/campaigns/ddp_buckets.lua --filter model=small --dry-run
--
-- A point is `ember run scripts/bench_ddp.lua ... --nproc 2`, which is not
-- under a launch, so the script's driver mode starts the ranks itself
-- (`ember launch --nproc 2`, then torchrun when python3 imports torch) and
-- writes one JSON line per (impl, world size, strategy) to the sweep's file:
-- a point gives several records (impl, world_size and strategy tell them apart).
local function num(v) return type(v) == "number" and v or nil end

return {
  name = "ddp_buckets",
  description = "bench_ddp.lua --strategies bucketed --plan: ms per step, exposed communication (measured and " ..
    "predicted by ember.ddp_planner) and hidden fraction by bucket size, Ember vs PyTorch DDP, 2 GPUs, " ..
    "bf16, batch 4 x 512 per GPU.",
  script = "scripts/bench_ddp.lua",
  args = {"--nproc", "2", "--device", "cuda", "--strategies", "bucketed", "--precision", "bf16",
    "--batch", "4", "--context", "512", "--warmup", "3", "--steps", "10", "--plan", "--no-single"},
  device = "cuda",
  axes = {
    {name = "model", values = {"small", "xl"}},
    {name = "bucket_mb", values = {1, 5, 25, 100, 1000}},
  },
  timeout = 1200,
  table = {columns = {
    "model", "bucket_mb", "impl", "world_size", "strategy",
    {key = "step_ms", title = "ms/step", fmt = "%.2f"},
    {key = "compute_ms", title = "compute ms", fmt = "%.2f"},
    {key = "comm_ms", title = "comm ms", fmt = "%.2f"},
    {key = "exposed_ms", title = "exposed ms", fmt = "%.2f"},
    {key = "predicted_exposed_ms", title = "predicted exposed ms", fmt = "%.2f"},
    {key = "hidden_pct", title = "hidden %", fmt = "%.0f",
     value = function(r) return num(r.hidden_frac) and 100 * r.hidden_frac end},
    {key = "peak_gib", title = "peak GiB", fmt = "%.2f",
     value = function(r) return num(r.peak_memory_bytes) and r.peak_memory_bytes / 2 ^ 30 end},
    "status",
  }},
  plots = {
    {x = "bucket_mb", y = "step_ms", series = "impl", facet = "model", xlog = true,
     where = function(r) return r.strategy == "bucketed" end,
     title = "ms per DDP step vs bucket size", ylabel = "ms per step", file = "step_ms.svg"},
    {x = "bucket_mb", y = "exposed_ms", series = "impl", facet = "model", xlog = true,
     where = function(r) return r.strategy == "bucketed" end,
     title = "exposed communication vs bucket size", ylabel = "exposed ms", file = "exposed_ms.svg"},
  },
}
